//! One connection's socket IO: the read loop (read a WebSocket message or time out, hand
//! it to the connection's [`Protocol`] state machine, stop when it says close) and the
//! write loop (drain the outbound queue, coalesce frames into few socket writes, close
//! with a reason). Every protocol decision lives in `gateway::protocol`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};

use tokio::sync::watch;

use super::protocol::{Input, Protocol, Step};
use super::{Drain, Gateway};
use crate::flow::{CloseReason, OutFrame, Outbound, OutboundRx};
use crate::obs::Stage;

/// Starts serving an upgraded connection in a task of its own, and returns at once.
///
/// Called from the upgrade callback: the WebSocket is split here, outside any future,
/// so no future keeps room for the whole socket, and axum's upgrade task (which reserves
/// room for every step of the handshake) ends now instead of living as long as the
/// connection. `guards` (the admission slots) are held until the connection ends.
pub(super) fn start<G: Send + 'static>(
    gw: Arc<Gateway>,
    socket: WebSocket,
    conn_id: u64,
    remote: SocketAddr,
    guards: G,
) {
    let (sink, stream) = socket.split();
    // One `conn` span per connection; its `uid` is recorded once at login (per-uid log
    // filters, see obs::logfilter).
    tokio::spawn(crate::obs::logfilter::in_conn(
        conn_id,
        serve_conn(gw, sink, stream, conn_id, remote, guards),
    ));
}

async fn serve_conn<G>(
    gw: Arc<Gateway>,
    sink: SplitSink<WebSocket, Message>,
    stream: SplitStream<WebSocket>,
    conn_id: u64,
    remote: SocketAddr,
    guards: G,
) {
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
    let write_timeout = Duration::from_secs(gw.flow.write_timeout_secs as u64);
    let writer = tokio::spawn(crate::obs::logfilter::in_current_conn(write_loop(
        sink,
        out.clone(),
        out_rx,
        gw.flow.coalesce_max_frames as usize,
        write_timeout,
        gw.metrics.clone(),
    )));
    let mut protocol = Protocol::new(gw.clone(), out.clone());
    let mut drain = gw.drain.subscribe();
    let read = {
        let _reading = gw.start_reading();
        read_loop(stream, &out, &mut protocol, &mut drain).await
    };
    let reason = match read {
        Some(reason) => reason,
        None => {
            // Graceful shutdown: no more frames are read; what this connection sent is
            // committed and acked before the close (the node moves to `Close` after the
            // last commit, or the write timeout ends the wait).
            let _ =
                tokio::time::timeout(write_timeout, drain.wait_for(|p| *p >= Drain::Close)).await;
            CloseReason::new(CloseReason::GOING_AWAY, "server shutting down")
        }
    };
    out.close(reason);
    let reason = out
        .close_reason()
        .unwrap_or(CloseReason::new(1000, "closed"));
    let user = protocol.user().map(str::to_owned);
    protocol.end();
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
    // The connection's slots under the caps are free only now, as it ends.
    drop(guards);
}

/// Reads until the connection must close (`Some(reason)`) or the node starts draining
/// (`None`: stop reading, keep the connection for the acks still to come).
async fn read_loop(
    mut stream: SplitStream<WebSocket>,
    out: &Arc<Outbound>,
    protocol: &mut Protocol,
    drain: &mut watch::Receiver<Drain>,
) -> Option<CloseReason> {
    loop {
        let next = tokio::select! {
            biased;
            () = out.closed() => return Some(out.close_reason().unwrap_or(CloseReason::new(1000, "closed"))),
            _ = drain.wait_for(|p| *p >= Drain::StopReading) => return None,
            next = tokio::time::timeout(protocol.read_timeout(), stream.next()) => next,
        };
        let input = match next {
            Err(_) if protocol.expires_in() == Some(Duration::ZERO) => {
                return Some(protocol.on_expired())
            }
            Err(_) => return Some(protocol.on_timeout()),
            Ok(None) => Input::Closed,
            Ok(Some(Err(e))) => {
                // axum wraps the tungstenite error (same version as our dependency).
                let inner = e.into_inner();
                match inner.downcast_ref::<tokio_tungstenite::tungstenite::Error>() {
                    Some(tokio_tungstenite::tungstenite::Error::Capacity(c)) => {
                        Input::Oversized(c.to_string())
                    }
                    _ => {
                        tracing::debug!(error = %inner, "read error");
                        return Some(CloseReason::new(1000, "read error"));
                    }
                }
            }
            Ok(Some(Ok(msg))) => match msg {
                Message::Binary(data) => Input::Binary(data),
                Message::Text(_) => Input::Text,
                Message::Close(_) => Input::Closed,
                Message::Ping(_) | Message::Pong(_) => Input::Control,
            },
        };
        // Boxed: handling a frame is the largest state of this loop, and an idle
        // connection would otherwise carry its room in its task all the time.
        if let Step::Close(reason) = Box::pin(protocol.on_message(input)).await {
            return Some(reason);
        }
    }
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    out: Arc<Outbound>,
    mut rx: OutboundRx,
    max_frames: usize,
    write_timeout: Duration,
    metrics: crate::obs::Metrics,
) {
    // Holds frames only while they are written: an idle connection holds no batch room.
    let mut batch: Vec<OutFrame> = Vec::new();
    loop {
        tokio::select! {
            biased;
            item = rx.frames.recv() => match item {
                Some(f) => batch.push(f),
                None => break,
            },
            () = out.closed() => break,
        }
        rx.fill(&mut batch, max_frames);
        // Boxed for the same reason as the read loop's frame handling.
        let written = Box::pin(write_batch(
            &mut sink,
            &out,
            &mut batch,
            write_timeout,
            &metrics,
        ));
        if let Err(reason) = written.await {
            out.close(reason);
            return;
        }
        // The room goes with the frames written; the next batch allocates its own.
        batch = Vec::new();
    }
    // Boxed: the closing steps run once, so the loop above need not carry their room.
    Box::pin(close_out(
        sink,
        out,
        rx,
        batch,
        max_frames,
        write_timeout,
        metrics,
    ))
    .await;
}

/// The end of the write loop: flushes what was queued before the close (errors explain
/// it), then sends the close frame with the reason.
async fn close_out(
    mut sink: SplitSink<WebSocket, Message>,
    out: Arc<Outbound>,
    mut rx: OutboundRx,
    mut batch: Vec<OutFrame>,
    max_frames: usize,
    write_timeout: Duration,
    metrics: crate::obs::Metrics,
) {
    loop {
        rx.fill(&mut batch, max_frames);
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
    let (bytes, len) = crate::flow::coalesce(batch, metrics);
    let t = Instant::now();
    let sent = tokio::time::timeout(write_timeout, sink.send(Message::Binary(bytes))).await;
    metrics.stage_since(Stage::Write, t);
    crate::flow::trace_written(batch, t, Instant::now());
    out.batch_written(batch, len);
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
