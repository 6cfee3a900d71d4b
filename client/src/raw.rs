//! `RawConn`: a thin WebSocket connection speaking `im.v1` frames, for tests and tools.
//!
//! One binary WebSocket message is one encoded `Frame`. Received `Batch` frames are
//! unwrapped into their inner frames (returned one by one, in order); WebSocket-level
//! pings and pongs are answered and skipped. It is also the transport under [`crate::Client`].

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use im_proto::{Body, Frame, Login, LoginOk, Message as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::error::ClientError;

/// How long [`RawConn::login`] waits for `LoginOk`.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RawConn::close`] waits for the server's close reply.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`RawConn::recv`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum RawEvent {
    /// One frame from the server (batches already unwrapped).
    Frame(Frame),
    /// The connection closed: a close frame (with its code) or the transport ended.
    Closed {
        /// The WebSocket close code, when the server sent a close frame.
        code: Option<u16>,
        /// The close reason, or the transport error text when there was no close frame.
        reason: String,
    },
}

/// A WebSocket connection to the client endpoint, frame in, frame out.
pub struct RawConn {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    queue: VecDeque<Frame>,
}

impl std::fmt::Debug for RawConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConn")
            .field("queued_frames", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl RawConn {
    /// Opens a WebSocket to `url` (e.g. `ws://127.0.0.1:7070/ws`) with TCP_NODELAY set.
    pub async fn connect(url: &str) -> Result<RawConn, ClientError> {
        let (ws, _resp) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        Ok(RawConn {
            ws,
            queue: VecDeque::new(),
        })
    }

    /// Sends one frame as one binary WebSocket message.
    pub async fn send(&mut self, f: &Frame) -> Result<(), ClientError> {
        self.ws.send(Message::Binary(im_proto::encode(f))).await?;
        Ok(())
    }

    /// Sends raw bytes as one binary message (for bad-input tests).
    pub async fn send_bytes(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        self.ws.send(Message::Binary(bytes.into())).await?;
        Ok(())
    }

    /// Sends a WebSocket text message (for bad-input tests; the server rejects it).
    pub async fn send_text(&mut self, text: String) -> Result<(), ClientError> {
        self.ws.send(Message::Text(text.into())).await?;
        Ok(())
    }

    /// Sends several frames, one message each, with a single flush at the end.
    pub(crate) async fn send_all(
        &mut self,
        frames: impl IntoIterator<Item = Frame>,
    ) -> Result<(), ClientError> {
        for f in frames {
            self.ws.feed(Message::Binary(im_proto::encode(&f))).await?;
        }
        self.ws.flush().await?;
        Ok(())
    }

    /// Receives the next frame or the close. Cancel-safe (usable in `select!`).
    pub async fn recv(&mut self) -> Result<RawEvent, ClientError> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Ok(RawEvent::Frame(f));
            }
            // The only await point: nothing is lost if this future is dropped here.
            let msg = match self.ws.next().await {
                None => {
                    return Ok(RawEvent::Closed {
                        code: None,
                        reason: "connection ended".into(),
                    })
                }
                Some(Ok(m)) => m,
                Some(Err(e)) => return closed_or_error(e),
            };
            match msg {
                Message::Binary(b) => {
                    let frame = Frame::decode(b)?;
                    self.push(frame);
                }
                Message::Close(cf) => {
                    return Ok(match cf {
                        Some(cf) => RawEvent::Closed {
                            code: Some(u16::from(cf.code)),
                            reason: cf.reason.to_string(),
                        },
                        None => RawEvent::Closed {
                            code: None,
                            reason: String::new(),
                        },
                    })
                }
                // tungstenite queues the pong reply itself and flushes it on the next read.
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                Message::Text(t) => {
                    return Err(ClientError::Protocol(format!(
                        "server sent a text message ({} bytes)",
                        t.len()
                    )))
                }
            }
        }
    }

    /// Like [`RawConn::recv`], failing with `ClientError::Timeout` after `d`.
    pub async fn recv_timeout(&mut self, d: Duration) -> Result<RawEvent, ClientError> {
        tokio::time::timeout(d, self.recv())
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Sends `Login` (req_id 1) and waits for `LoginOk`; an `Error` reply becomes
    /// `ClientError::Server`. Other frames that arrive first stay queued for `recv`.
    pub async fn login(
        &mut self,
        token: &str,
        device_id: &str,
        resume: bool,
    ) -> Result<LoginOk, ClientError> {
        self.login_with(1, token, device_id, resume, LOGIN_TIMEOUT)
            .await
    }

    /// `login` with an explicit request id and timeout (used by the SDK).
    pub(crate) async fn login_with(
        &mut self,
        req_id: u64,
        token: &str,
        device_id: &str,
        resume: bool,
        timeout: Duration,
    ) -> Result<LoginOk, ClientError> {
        let login = Login {
            token: token.to_owned(),
            device_id: device_id.to_owned(),
            resume,
        };
        self.send(&im_proto::frame(req_id, Body::Login(login)))
            .await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut early = Vec::new();
        let result = loop {
            let ev = match tokio::time::timeout_at(deadline, self.recv()).await {
                Err(_) => break Err(ClientError::Timeout),
                Ok(Err(e)) => break Err(e),
                Ok(Ok(ev)) => ev,
            };
            match ev {
                RawEvent::Closed { code, reason } => {
                    break Err(ClientError::Closed { code, reason })
                }
                RawEvent::Frame(f) => match f.body {
                    Some(Body::LoginOk(ok)) => break Ok(ok),
                    Some(Body::Error(e)) if f.req_id == req_id || f.req_id == 0 => {
                        break Err(ClientError::from_server(e))
                    }
                    body => early.push(Frame {
                        req_id: f.req_id,
                        body,
                    }),
                },
            }
        };
        // Frames that arrived before the reply are put back in front, in order.
        for f in early.into_iter().rev() {
            self.queue.push_front(f);
        }
        result
    }

    /// Closes the connection (close handshake, waiting briefly for the server's reply).
    pub async fn close(&mut self) -> Result<(), ClientError> {
        match self.ws.close(None).await {
            Ok(()) => {}
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                return Ok(())
            }
            Err(e) => return Err(e.into()),
        }
        let drain = async { while let Some(Ok(_)) = self.ws.next().await {} };
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
        Ok(())
    }

    /// Queues a decoded frame, flattening batches (recursively) in order.
    fn push(&mut self, frame: Frame) {
        match frame.body {
            Some(Body::Batch(batch)) => {
                for inner in batch.frames {
                    self.push(inner);
                }
            }
            _ => self.queue.push_back(frame),
        }
    }
}

/// Maps a read error: a dropped transport is a `Closed` event, anything else an error.
fn closed_or_error(e: tungstenite::Error) -> Result<RawEvent, ClientError> {
    use std::io::ErrorKind;
    let closed = match &e {
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => true,
        tungstenite::Error::Protocol(
            tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
        ) => true,
        tungstenite::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        ),
        _ => false,
    };
    if closed {
        Ok(RawEvent::Closed {
            code: None,
            reason: e.to_string(),
        })
    } else {
        Err(e.into())
    }
}
