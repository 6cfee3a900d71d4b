//! One connection: the read loop (decode, login, hand frames to the pipeline, timers,
//! bad-input handling) and the write loop (drain the outbound queue, coalesce frames into
//! few socket writes, close with a reason).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use im_proto::{error_frame, frame, Body, ErrorCode, Frame, LoginOk, Message as _};

use super::Gateway;
use crate::flow::{CloseReason, OutFrame, Outbound, OutboundRx};
use crate::obs::Stage;
use crate::pipeline::Session;

/// Longest accepted device id, in bytes.
const MAX_DEVICE_ID: usize = 128;

pub(super) async fn serve(gw: Arc<Gateway>, socket: WebSocket, conn_id: u64, remote: SocketAddr) {
    // One `conn` span per connection; its `uid` is recorded once at login (per-uid log
    // filters, see obs::logfilter).
    crate::obs::logfilter::in_conn(conn_id, serve_conn(gw, socket, conn_id, remote)).await
}

async fn serve_conn(gw: Arc<Gateway>, socket: WebSocket, conn_id: u64, remote: SocketAddr) {
    let (out, out_rx) = Outbound::new(
        conn_id,
        remote.to_string(),
        gw.flow.soft_mark_bytes,
        gw.flow.hard_mark_bytes,
        gw.metrics.clone(),
    );
    gw.conns.insert(out.clone());
    gw.metrics.connections.increment(1.0);
    gw.metrics.connections_opened.increment(1);
    let (sink, stream) = socket.split();
    let write_timeout = Duration::from_secs(gw.flow.write_timeout_secs as u64);
    let writer = tokio::spawn(crate::obs::logfilter::in_current_conn(write_loop(
        sink,
        out.clone(),
        out_rx,
        gw.flow.coalesce_max_frames as usize,
        write_timeout,
        gw.metrics.clone(),
    )));
    let mut user = None;
    let reason = read_loop(&gw, stream, &out, &mut user).await;
    out.close(reason);
    let reason = out
        .close_reason()
        .unwrap_or(CloseReason::new(1000, "closed"));
    if let Some(user) = &user {
        gw.pipeline.router.unregister(user, conn_id);
    }
    if tokio::time::timeout(write_timeout + Duration::from_secs(1), writer)
        .await
        .is_err()
    {
        tracing::debug!(conn_id, "write loop did not finish in time");
    }
    gw.conns.remove(conn_id);
    out.finish();
    gw.metrics.connection_closed(reason.reason);
    let who = user.as_deref().unwrap_or("");
    if reason.code == CloseReason::SLOW {
        // Operators want to see these without raising the level.
        tracing::warn!(
            conn_id,
            user = who,
            reason = reason.reason,
            "slow consumer disconnected"
        );
    } else {
        tracing::debug!(
            conn_id,
            user = who,
            reason = reason.reason,
            "connection closed"
        );
    }
}

/// Sends an Error frame on the connection.
fn send_error(out: &Outbound, req_id: u64, code: ErrorCode, message: &str) {
    out.push(im_proto::encode(&error_frame(req_id, code, message)), true);
}

async fn read_loop(
    gw: &Gateway,
    mut stream: SplitStream<WebSocket>,
    out: &Arc<Outbound>,
    user: &mut Option<String>,
) -> CloseReason {
    let limits = &gw.limits;
    let m = &gw.metrics;
    let max = limits.max_frame_bytes as usize;
    let login_timeout = Duration::from_secs(limits.login_timeout_secs as u64);
    let idle_timeout = Duration::from_secs(limits.idle_timeout_secs as u64);
    let mut closed = out.close_watch();
    let mut session: Option<Session> = None;
    let mut bad = 0u32;
    loop {
        let wait = if session.is_some() {
            idle_timeout
        } else {
            login_timeout
        };
        let next = tokio::select! {
            next = tokio::time::timeout(wait, stream.next()) => next,
            _ = closed.changed() => return out.close_reason().unwrap_or(CloseReason::new(1000, "closed")),
        };
        let msg = match next {
            Err(_) if session.is_none() => {
                m.bad_frame("login_timeout");
                send_error(out, 0, ErrorCode::Unauthenticated, "login timeout");
                return CloseReason::new(CloseReason::POLICY, "login timeout");
            }
            Err(_) => return CloseReason::new(CloseReason::IDLE, "idle timeout"),
            Ok(None) => return CloseReason::new(1000, "client closed"),
            Ok(Some(Err(e))) => {
                // axum wraps the tungstenite error (same version as our dependency).
                let inner = e.into_inner();
                if let Some(tokio_tungstenite::tungstenite::Error::Capacity(c)) =
                    inner.downcast_ref::<tokio_tungstenite::tungstenite::Error>()
                {
                    m.bad_frame("too_large");
                    send_error(
                        out,
                        0,
                        ErrorCode::TooLarge,
                        &format!("frame too large: {c}"),
                    );
                    return CloseReason::new(CloseReason::TOO_BIG, "frame too large");
                }
                tracing::debug!(error = %inner, "read error");
                return CloseReason::new(1000, "read error");
            }
            Ok(Some(Ok(msg))) => msg,
        };
        let data = match msg {
            Message::Binary(data) => data,
            Message::Text(_) => {
                m.bad_frame("text");
                send_error(
                    out,
                    0,
                    ErrorCode::BadFrame,
                    "text frames are not accepted; send binary protobuf Frames",
                );
                return CloseReason::new(CloseReason::UNSUPPORTED, "text frames are not accepted");
            }
            Message::Close(_) => return CloseReason::new(1000, "client closed"),
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        out.frames_in
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        if data.len() > max {
            m.bad_frame("too_large");
            send_error(
                out,
                0,
                ErrorCode::TooLarge,
                &format!("frame of {} bytes is over the {max} byte limit", data.len()),
            );
            return CloseReason::new(CloseReason::TOO_BIG, "frame too large");
        }
        let f = match Frame::decode(data) {
            Ok(f) => f,
            Err(e) => {
                m.bad_frame("decode");
                send_error(
                    out,
                    0,
                    ErrorCode::BadFrame,
                    &format!("frame does not decode: {e}"),
                );
                bad += 1;
                if bad > limits.max_bad_frames {
                    return CloseReason::new(CloseReason::POLICY, "too many bad frames");
                }
                continue;
            }
        };
        m.stage_since(Stage::Decode, started);
        let Some(s) = &session else {
            match login(gw, out, f) {
                Ok(s) => {
                    *user = Some(s.user_id.clone());
                    session = Some(s);
                    continue;
                }
                Err(reason) => return reason,
            }
        };
        let frames = match f.body {
            Some(Body::Batch(b)) => b.frames,
            _ => vec![f],
        };
        for f in frames {
            let req_id = f.req_id;
            let what = Handled::of(&f);
            let r = match gw.pipeline.handle(s, f, started).await {
                Ok(()) => {
                    what.log(req_id);
                    continue;
                }
                Err(r) => r,
            };
            if let Some(reason) = r.bad_reason {
                m.bad_frame(reason);
            }
            out.push(im_proto::encode(&r.to_frame(req_id)), true);
            if r.bad_reason == Some("protocol") {
                bad += 1;
                if bad > limits.max_bad_frames {
                    return CloseReason::new(CloseReason::POLICY, "too many bad frames");
                }
            }
        }
    }
}

/// Checks the first frame: it must be a Login with a valid token.
fn login(gw: &Gateway, out: &Arc<Outbound>, f: Frame) -> Result<Session, CloseReason> {
    let m = &gw.metrics;
    let Some(Body::Login(l)) = f.body else {
        m.bad_frame("unauthenticated");
        send_error(
            out,
            f.req_id,
            ErrorCode::Unauthenticated,
            "the first frame must be Login",
        );
        return Err(CloseReason::new(CloseReason::POLICY, "login required"));
    };
    if l.device_id.len() > MAX_DEVICE_ID {
        m.bad_frame("protocol");
        send_error(out, f.req_id, ErrorCode::BadFrame, "device_id too long");
        return Err(CloseReason::new(CloseReason::POLICY, "bad login"));
    }
    let user_id = match gw.keys.verify(&l.token) {
        Ok(u) => u,
        Err(e) => {
            m.bad_frame("unauthenticated");
            send_error(out, f.req_id, ErrorCode::Unauthenticated, &e.to_string());
            return Err(CloseReason::new(CloseReason::POLICY, "invalid token"));
        }
    };
    out.set_user(&user_id);
    crate::obs::logfilter::set_conn_uid(&user_id);
    gw.pipeline.router.register(&user_id, out.clone());
    let ok = frame(
        f.req_id,
        Body::LoginOk(LoginOk {
            user_id: user_id.clone(),
            session_id: uuid::Uuid::now_v7().simple().to_string(),
            heartbeat_secs: gw.limits.heartbeat_secs,
            node_id: gw.node_id.clone(),
        }),
    );
    out.push(im_proto::encode(&ok), true);
    tracing::debug!(conn_id = out.conn_id, user = %user_id, device = %l.device_id, resume = l.resume, "logged in");
    Ok(Session::new(user_id, out.clone(), &gw.limits))
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    out: Arc<Outbound>,
    mut rx: OutboundRx,
    max_frames: usize,
    write_timeout: Duration,
    metrics: crate::obs::Metrics,
) {
    let mut batch: Vec<OutFrame> = Vec::with_capacity(max_frames);
    loop {
        tokio::select! {
            biased;
            item = rx.frames.recv() => match item {
                Some(f) => batch.push(f),
                None => break,
            },
            _ = rx.close.changed() => break,
        }
        while batch.len() < max_frames {
            match rx.frames.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        if let Err(reason) = write_batch(&mut sink, &out, &mut batch, write_timeout, &metrics).await
        {
            out.close(reason);
            return;
        }
    }
    // Closing: flush what was queued before the close (errors explain it), then close.
    loop {
        while batch.len() < max_frames {
            match rx.frames.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        if write_batch(&mut sink, &out, &mut batch, write_timeout, &metrics)
            .await
            .is_err()
        {
            return;
        }
    }
    let reason = out
        .close_reason()
        .unwrap_or(CloseReason::new(1000, "closed"));
    let close = Message::Close(Some(CloseFrame {
        code: reason.code,
        reason: reason.reason.into(),
    }));
    let _ = tokio::time::timeout(write_timeout, sink.send(close)).await;
}

/// Writes the batch as one WebSocket message (a `Batch` frame when there are several).
async fn write_batch(
    sink: &mut SplitSink<WebSocket, Message>,
    out: &Outbound,
    batch: &mut Vec<OutFrame>,
    write_timeout: Duration,
    metrics: &crate::obs::Metrics,
) -> Result<(), CloseReason> {
    let now = Instant::now();
    let mut len = 0;
    for f in batch.iter() {
        metrics.stage(Stage::QueueWait, now - f.enqueued);
        len += f.bytes.len();
    }
    let bytes = if batch.len() == 1 {
        batch[0].bytes.clone()
    } else {
        im_proto::encode_batch(batch.iter().map(|f| f.bytes.as_ref()))
    };
    let t = Instant::now();
    let sent = tokio::time::timeout(write_timeout, sink.send(Message::Binary(bytes))).await;
    metrics.stage_since(Stage::Write, t);
    out.written(len);
    out.frames_out
        .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
    for f in batch.drain(..) {
        if let Some(e) = f.e2e {
            e.done(metrics);
        }
    }
    match sent {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(CloseReason::new(1000, "write error")),
        Err(_) => {
            metrics.slow_consumer_disconnects.increment(1);
            metrics
                .totals
                .slow_disconnects
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(CloseReason::new(CloseReason::SLOW, "write timeout"))
        }
    }
}

/// What a handled frame was, in Copy fields only (nothing is cloned for a debug event
/// that is almost always off).
#[derive(Clone, Copy)]
enum Handled {
    Send { bytes: usize, group: bool },
    DeliverAck { seq: u64 },
    Sync { cursors: usize, limit: u32 },
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
            Handled::Other => {}
        }
    }
}
