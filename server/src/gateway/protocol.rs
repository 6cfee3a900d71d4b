//! Protocol: one connection's state machine, everything between "a WebSocket message was
//! read" and "frames were queued": the size check, decode, the Login-first rule and the
//! login itself, `Batch` unwrapping, the hand-off to [`Pipeline::handle`](crate::pipeline::Pipeline::handle),
//! bad-frame counting, the Ping rate limit and the RATE_LIMITED flood limit, `Error`
//! frames, every close decision, which timeout (login or idle) applies, and when the
//! session ends with its token (`exp` plus `limits.token_leeway_secs`; a fresh Login of
//! the same user on the open connection moves that deadline). It owns no
//! socket: `gateway::conn` feeds it [`Input`]s and acts on the [`Step`]s it returns, so
//! tests and the fuzzer (`fuzz/`) drive it directly against a real pipeline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use im_proto::{error_frame, frame, Body, ErrorCode, Frame, LoginOk, Message as _};

use super::Gateway;
use crate::flow::{CloseReason, Outbound};
use crate::obs::Stage;
use crate::obs::FLOOD_FRAMES;
use crate::pipeline::{FrameKind, Session};

/// Longest accepted device id, in bytes.
pub const MAX_DEVICE_ID: usize = 128;

/// One thing read from the socket, as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A binary WebSocket message: one encoded `Frame`.
    Binary(Bytes),
    /// A text WebSocket message (refused: `BAD_FRAME` and close 1003).
    Text,
    /// A WebSocket-level ping or pong (answered by the socket layer; only resets the idle timer).
    Control,
    /// The client closed: a close frame or the end of the stream.
    Closed,
    /// The socket layer refused a message over its own cap; the text says what it saw.
    Oversized(String),
}

/// What the connection does after an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Keep reading.
    Continue,
    /// Close with this code and reason (after flushing what is queued).
    Close(CloseReason),
}

/// RATE_LIMITED refusals of one frame kind, counted in fixed windows.
#[derive(Debug, Clone)]
struct FloodWindow {
    start: Instant,
    count: u32,
}

impl FloodWindow {
    fn new(now: Instant) -> Self {
        FloodWindow {
            start: now,
            count: 0,
        }
    }

    /// Counts one refusal at `now`; true when it is past `max` within `window` (`max` 0:
    /// never).
    fn over(&mut self, now: Instant, window: Duration, max: u32) -> bool {
        if max == 0 {
            return false;
        }
        if now.saturating_duration_since(self.start) >= window {
            self.start = now;
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        self.count > max
    }
}

/// The state machine of one connection: not logged in, then one [`Session`].
pub struct Protocol {
    gw: Arc<Gateway>,
    out: Arc<Outbound>,
    session: Option<Session>,
    /// The session's token `exp` (unix seconds).
    token_exp: u64,
    bad: u32,
    /// RATE_LIMITED refusals per flood kind (`obs::FLOOD_FRAMES`), windows counted from
    /// the connection's start; allocated at the first refusal (most connections never
    /// have one, and an idle one should not carry the room).
    refusals: Option<Box<[FloodWindow; FLOOD_FRAMES.len()]>>,
}

impl Protocol {
    /// A new connection's state machine; replies and errors go to `out`.
    pub fn new(gw: Arc<Gateway>, out: Arc<Outbound>) -> Self {
        Protocol {
            gw,
            out,
            session: None,
            token_exp: 0,
            bad: 0,
            refusals: None,
        }
    }

    /// The logged-in user, once the Login succeeded.
    pub fn user(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.user_id.as_str())
    }

    /// How long the next read may take: the login timeout until logged in, then the idle timeout.
    pub fn timeout(&self) -> Duration {
        let l = &self.gw.limits;
        Duration::from_secs(if self.session.is_some() {
            l.idle_timeout_secs
        } else {
            l.login_timeout_secs
        } as u64)
    }

    /// How long the next read may take: [`Protocol::timeout`], cut short by the token's
    /// expiry. On a timeout, `expires_in() == Some(ZERO)` tells the expiry apart.
    pub fn read_timeout(&self) -> Duration {
        match self.expires_in() {
            Some(left) => left.min(self.timeout()),
            None => self.timeout(),
        }
    }

    /// How long until the session's token expires (plus the leeway): then the
    /// connection closes with [`Protocol::on_expired`]. `None` before login.
    pub fn expires_in(&self) -> Option<Duration> {
        self.session.as_ref()?;
        let end = self
            .token_exp
            .saturating_add(self.gw.limits.token_leeway_secs as u64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Some(Duration::from_secs(end).saturating_sub(now))
    }

    /// The session's token expired: close 4003 "token expired" (with an
    /// `UNAUTHENTICATED` error saying so).
    pub fn on_expired(&mut self) -> CloseReason {
        self.error(
            0,
            ErrorCode::Unauthenticated,
            "token expired: log in again with a fresh token",
        );
        CloseReason::new(CloseReason::TOKEN_EXPIRED, "token expired")
    }

    /// Nothing arrived within [`Protocol::timeout`]: the close for the state we are in
    /// (before login it is counted and explained with an `UNAUTHENTICATED` error).
    pub fn on_timeout(&mut self) -> CloseReason {
        if self.session.is_some() {
            return CloseReason::new(CloseReason::IDLE, "idle timeout");
        }
        self.gw.metrics.bad_frame("login_timeout");
        self.error(0, ErrorCode::Unauthenticated, "login timeout");
        CloseReason::new(CloseReason::POLICY, "login timeout")
    }

    /// Handles one input from the socket.
    pub async fn on_message(&mut self, input: Input) -> Step {
        let data = match input {
            Input::Binary(data) => data,
            Input::Text => {
                self.gw.metrics.bad_frame("text");
                self.error(
                    0,
                    ErrorCode::BadFrame,
                    "text frames are not accepted; send binary protobuf Frames",
                );
                return Step::Close(CloseReason::new(
                    CloseReason::UNSUPPORTED,
                    "text frames are not accepted",
                ));
            }
            Input::Control => return Step::Continue,
            Input::Closed => return Step::Close(CloseReason::new(1000, "client closed")),
            Input::Oversized(what) => {
                self.gw.metrics.bad_frame("too_large");
                self.error(0, ErrorCode::TooLarge, &format!("frame too large: {what}"));
                return Step::Close(CloseReason::new(CloseReason::TOO_BIG, "frame too large"));
            }
        };
        self.on_binary(data).await
    }

    /// Ends the connection's session: it leaves the router (call once, after the last input).
    pub fn end(&mut self) {
        if let Some(s) = self.session.take() {
            self.gw
                .pipeline
                .router
                .unregister(&s.user_id, self.out.conn_id);
        }
    }

    async fn on_binary(&mut self, data: Bytes) -> Step {
        // One Arc clone per frame, not one per metric handle.
        let gw = self.gw.clone();
        let m = &gw.metrics;
        self.out
            .frames_in
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let max = self.gw.limits.max_frame_bytes as usize;
        if data.len() > max {
            m.bad_frame("too_large");
            self.error(
                0,
                ErrorCode::TooLarge,
                &format!("frame of {} bytes is over the {max} byte limit", data.len()),
            );
            return Step::Close(CloseReason::new(CloseReason::TOO_BIG, "frame too large"));
        }
        let f = match Frame::decode(data) {
            Ok(f) => f,
            Err(e) => {
                m.bad_frame("decode");
                self.error(
                    0,
                    ErrorCode::BadFrame,
                    &format!("frame does not decode: {e}"),
                );
                return self.bad_frame();
            }
        };
        m.stage_since(Stage::Decode, started);
        if self.session.is_none() {
            return match self.login(f) {
                Ok((s, exp)) => {
                    self.session = Some(s);
                    self.token_exp = exp;
                    Step::Continue
                }
                Err(reason) => Step::Close(reason),
            };
        }
        if let Some(Body::Login(l)) = &f.body {
            return self.relogin(f.req_id, &l.token);
        }
        let frames = match f.body {
            Some(Body::Batch(b)) => b.frames,
            _ => vec![f],
        };
        let max_batch = self.gw.limits.max_batch_frames as usize;
        if frames.len() > max_batch {
            m.bad_frame("batch_too_large");
            self.error(
                0,
                ErrorCode::BadFrame,
                &format!(
                    "batch of {} frames is over the {max_batch} frame limit; none was handled",
                    frames.len()
                ),
            );
            return self.bad_frame();
        }
        for f in frames {
            if let Step::Close(reason) = self.on_frame(f, started).await {
                return Step::Close(reason);
            }
        }
        Step::Continue
    }

    /// One frame of a logged-in session (a batch's frames one by one).
    async fn on_frame(&mut self, f: Frame, started: Instant) -> Step {
        let Some(s) = &self.session else {
            return Step::Continue;
        };
        let req_id = f.req_id;
        let what = Handled::of(&f);
        // RATE_LIMITED can only come from a kind's bucket; anything else floods as Send.
        let kind = f.body.as_ref().and_then(FrameKind::of);
        let r = if kind == Some(FrameKind::Ping) {
            match s.take(FrameKind::Ping, &self.gw.limits) {
                Ok(()) => self.gw.pipeline.handle(s, f, started).await,
                Err(r) => Err(r),
            }
        } else {
            self.gw.pipeline.handle(s, f, started).await
        };
        let r = match r {
            Ok(()) => {
                what.log(req_id);
                return Step::Continue;
            }
            Err(r) => r,
        };
        if let Some(user) = self.user() {
            self.gw.pipeline.users.refused(user, r.code);
        }
        if let Some(reason) = r.bad_reason {
            self.gw.metrics.bad_frame(reason);
        }
        self.out.push(im_proto::encode(&r.to_frame(req_id)), true);
        if r.bad_reason == Some("protocol") {
            return self.bad_frame();
        }
        if r.code == ErrorCode::RateLimited {
            return self.rate_limited(kind.unwrap_or(FrameKind::Send));
        }
        Step::Continue
    }

    /// Counts a bad frame; past `limits.max_bad_frames` the connection closes.
    fn bad_frame(&mut self) -> Step {
        self.bad = self.bad.saturating_add(1);
        if self.bad > self.gw.limits.max_bad_frames {
            return Step::Close(CloseReason::new(CloseReason::POLICY, "too many bad frames"));
        }
        Step::Continue
    }

    /// Counts a RATE_LIMITED refusal; past `limits.max_rate_limited` within
    /// `limits.rate_limited_window_secs` the connection closes (1008).
    fn rate_limited(&mut self, kind: FrameKind) -> Step {
        let l = &self.gw.limits;
        let window = Duration::from_secs(l.rate_limited_window_secs as u64);
        let opened = self.out.opened;
        let windows = self
            .refusals
            .get_or_insert_with(|| Box::new(FLOOD_FRAMES.map(|_| FloodWindow::new(opened))));
        let counter = &mut windows[kind.flood_index()];
        if !counter.over(Instant::now(), window, l.max_rate_limited) {
            return Step::Continue;
        }
        let label = kind.rule().flood;
        metrics::counter!("im_flood_disconnects_total", "frame" => label).increment(1);
        if let Some(user) = self.user() {
            self.gw.pipeline.users.flooded(user);
        }
        // Once per connection: it closes now.
        tracing::warn!(
            conn_id = self.out.conn_id,
            user = self.user().unwrap_or(""),
            frame = label,
            max_rate_limited = l.max_rate_limited,
            window_secs = l.rate_limited_window_secs,
            "closing a flooding connection: too many RATE_LIMITED refusals"
        );
        Step::Close(kind.flood_close())
    }

    /// Queues an Error frame.
    fn error(&self, req_id: u64, code: ErrorCode, message: &str) {
        self.out
            .push(im_proto::encode(&error_frame(req_id, code, message)), true);
    }

    /// A Login on a logged-in connection: a fresh token of the same user extends the
    /// session to its `exp`; any other token is refused and closes the connection.
    fn relogin(&mut self, req_id: u64, token: &str) -> Step {
        let user = self.user().unwrap_or_default().to_owned();
        match self.gw.keys.verify_claims(token) {
            Ok(c) if c.sub == user => {
                self.token_exp = self.token_exp.max(c.exp);
                let ok = frame(
                    req_id,
                    Body::LoginOk(LoginOk {
                        user_id: user,
                        session_id: String::new(),
                        heartbeat_secs: self.gw.limits.heartbeat_secs,
                        node_id: self.gw.node_id.clone(),
                    }),
                );
                self.out.push(im_proto::encode(&ok), true);
                Step::Continue
            }
            Ok(_) => {
                self.gw.metrics.bad_frame("unauthenticated");
                self.error(
                    req_id,
                    ErrorCode::Unauthenticated,
                    "a Login on an open connection must be for the same user",
                );
                Step::Close(CloseReason::new(CloseReason::POLICY, "user changed"))
            }
            Err(e) => {
                self.gw.metrics.bad_frame("unauthenticated");
                self.error(req_id, ErrorCode::Unauthenticated, &e.to_string());
                Step::Close(CloseReason::new(CloseReason::POLICY, "invalid token"))
            }
        }
    }

    /// Checks the first frame: it must be a Login with a valid token. Returns the
    /// session and its token's `exp`.
    fn login(&self, f: Frame) -> Result<(Session, u64), CloseReason> {
        let gw = &self.gw;
        let m = &gw.metrics;
        let Some(Body::Login(l)) = f.body else {
            m.bad_frame("unauthenticated");
            self.error(
                f.req_id,
                ErrorCode::Unauthenticated,
                "the first frame must be Login",
            );
            return Err(CloseReason::new(CloseReason::POLICY, "login required"));
        };
        if l.device_id.len() > MAX_DEVICE_ID {
            m.bad_frame("protocol");
            self.error(f.req_id, ErrorCode::BadFrame, "device_id too long");
            return Err(CloseReason::new(CloseReason::POLICY, "bad login"));
        }
        let (user_id, exp) = match gw.keys.verify_claims(&l.token) {
            Ok(c) => (c.sub, c.exp),
            Err(e) => {
                m.bad_frame("unauthenticated");
                self.error(f.req_id, ErrorCode::Unauthenticated, &e.to_string());
                return Err(CloseReason::new(CloseReason::POLICY, "invalid token"));
            }
        };
        if !crate::pipeline::announce::may_log_in(&user_id) {
            m.bad_frame("unauthenticated");
            self.error(
                f.req_id,
                ErrorCode::Unauthenticated,
                "this user id is reserved for server messages",
            );
            return Err(CloseReason::new(CloseReason::POLICY, "invalid token"));
        }
        let max_sessions = gw.limits.max_sessions_per_user as usize;
        if !gw
            .pipeline
            .router
            .try_register(&user_id, self.out.clone(), max_sessions)
        {
            m.bad_frame("session_limit");
            self.error(
                f.req_id,
                ErrorCode::RateLimited,
                &format!(
                    "user {user_id} already holds {max_sessions} sessions on this node (limits.max_sessions_per_user); close one first"
                ),
            );
            return Err(CloseReason::new(CloseReason::POLICY, "too many sessions"));
        }
        self.out.set_user(&user_id);
        self.out.set_device(&l.device_id);
        crate::obs::logfilter::set_conn_uid(&user_id);
        let ok = frame(
            f.req_id,
            Body::LoginOk(LoginOk {
                user_id: user_id.clone(),
                session_id: uuid::Uuid::now_v7().simple().to_string(),
                heartbeat_secs: gw.limits.heartbeat_secs,
                node_id: gw.node_id.clone(),
            }),
        );
        self.out.push(im_proto::encode(&ok), true);
        tracing::debug!(conn_id = self.out.conn_id, user = %user_id, device = %l.device_id, resume = l.resume, "logged in");
        Ok((
            Session::new(user_id, self.out.clone()).on_device(&l.device_id),
            exp,
        ))
    }
}

/// What a handled frame was, in Copy fields only (nothing is cloned for a debug event
/// that is almost always off).
#[derive(Clone, Copy)]
enum Handled {
    Send { bytes: usize, group: bool },
    DeliverAck { seq: u64 },
    Sync { cursors: usize, limit: u32 },
    Ping,
    GroupOp,
    MarkRead,
    Conversations,
    History,
    Presence,
    Typing,
    Other,
}

impl Handled {
    fn of(f: &Frame) -> Handled {
        match &f.body {
            Some(Body::Send(s)) => Handled::Send {
                bytes: s.payload.len(),
                group: matches!(s.target, Some(im_proto::send::Target::GroupId(_))),
            },
            Some(Body::DeliverAck(a)) => Handled::DeliverAck { seq: a.seq },
            Some(Body::Sync(r)) => Handled::Sync {
                cursors: r.cursors.len(),
                limit: r.limit,
            },
            Some(Body::Ping(_)) => Handled::Ping,
            Some(Body::GroupOp(_)) => Handled::GroupOp,
            Some(Body::MarkRead(_)) => Handled::MarkRead,
            Some(Body::ListConversations(_) | Body::SetConversationFlags(_)) => {
                Handled::Conversations
            }
            Some(Body::FetchHistory(_)) => Handled::History,
            Some(Body::PresenceSubscribe(_) | Body::SetPresence(_)) => Handled::Presence,
            Some(Body::Typing(_)) => Handled::Typing,
            _ => Handled::Other,
        }
    }

    /// A debug event per handled frame: one relaxed load when debug is off.
    fn log(self, req_id: u64) {
        match self {
            Handled::Send { bytes, group } => {
                tracing::debug!(req_id, bytes, group, "send accepted")
            }
            Handled::DeliverAck { seq } => tracing::debug!(req_id, seq, "deliver ack"),
            Handled::Sync { cursors, limit } => {
                tracing::debug!(req_id, cursors, limit, "sync served")
            }
            Handled::Ping
            | Handled::GroupOp
            | Handled::MarkRead
            | Handled::Conversations
            | Handled::History
            | Handled::Presence
            | Handled::Typing
            | Handled::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FloodWindow;
    use std::time::{Duration, Instant};

    #[test]
    fn flood_window_closes_past_max_and_resets_per_window() {
        let t0 = Instant::now();
        let w = Duration::from_secs(10);
        let mut f = FloodWindow::new(t0);
        assert!((0..3).all(|_| !f.over(t0, w, 3)));
        assert!(
            f.over(t0, w, 3),
            "the 4th refusal in the window is past max 3"
        );
        let mut f = FloodWindow::new(t0);
        assert!((0..3).all(|_| !f.over(t0, w, 3)));
        let later = t0 + Duration::from_secs(11);
        assert!(!f.over(later, w, 3), "a new window starts from zero");
        let mut never = FloodWindow::new(t0);
        assert!((0..10_000).all(|_| !never.over(t0, w, 0)));
    }
}
