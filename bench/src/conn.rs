//! The bench's WebSocket connection: one `im.v1` frame per binary message, like
//! `im_client::RawConn`, plus what a load generator needs that `RawConn` cannot do:
//!
//! - connect from a chosen local address (`TcpSocket::bind` before `connect`), so that
//!   connections can be spread over many loopback source addresses and their number is
//!   not capped by one address's ephemeral port range;
//! - small WebSocket buffers (tungstenite allocates the read buffer eagerly: 128 KiB by
//!   default, which would cost the generator 2.4 GiB at 19,000 connections);
//! - WebSocket-level pings whose pongs are surfaced (for heartbeat round trips);
//! - an abrupt kill (RST, no close handshake) for disconnect injection.
//!
//! Received `Batch` frames are unwrapped into their inner frames, in order. Errors are
//! `im_client::ClientError`, so the scenarios handle both kinds of failure alike.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use im_client::ClientError;
use im_proto::{Body, Frame, Login, LoginOk, Message as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

/// How long [`Conn::login`] waits for `LoginOk`.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`Conn::close`] waits for the server's close reply.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default WebSocket read buffer of a bench connection (grows for larger messages).
pub const DEFAULT_READ_BUFFER: usize = 8 * 1024;
/// Default WebSocket write buffer of a bench connection.
pub const DEFAULT_WRITE_BUFFER: usize = 4 * 1024;

/// How to open a connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    /// Local address to bind before connecting (`None`: the OS chooses).
    pub local_ip: Option<IpAddr>,
    /// WebSocket read buffer (eagerly allocated).
    pub read_buffer: usize,
    /// WebSocket write buffer.
    pub write_buffer: usize,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            local_ip: None,
            read_buffer: DEFAULT_READ_BUFFER,
            write_buffer: DEFAULT_WRITE_BUFFER,
        }
    }
}

/// What [`Conn::recv`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One frame from the server (batches already unwrapped).
    Frame(Frame),
    /// The pong to a [`Conn::ws_ping`], with the ping's payload.
    WsPong(u64),
    /// The connection closed: a close frame (with its code) or the transport ended.
    Closed {
        /// The WebSocket close code, when the server sent a close frame.
        code: Option<u16>,
        /// The close reason, or the transport error text when there was no close frame.
        reason: String,
    },
}

/// A WebSocket connection to the client endpoint, frame in, frame out.
pub struct Conn {
    ws: WebSocketStream<TcpStream>,
    queue: VecDeque<Frame>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("queued_frames", &self.queue.len())
            .finish_non_exhaustive()
    }
}

fn io_error(e: std::io::Error) -> ClientError {
    ClientError::from(tungstenite::Error::Io(e))
}

impl Conn {
    /// Opens a TCP connection to `addr` (from `opts.local_ip` when set, TCP_NODELAY on)
    /// and runs the WebSocket handshake for `url` over it.
    pub async fn connect(
        addr: SocketAddr,
        url: &str,
        opts: &ConnectOpts,
    ) -> Result<Conn, ClientError> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(io_error)?;
        if let Some(ip) = opts.local_ip {
            socket.bind(SocketAddr::new(ip, 0)).map_err(io_error)?;
        }
        let stream = socket.connect(addr).await.map_err(io_error)?;
        stream.set_nodelay(true).map_err(io_error)?;
        let config = WebSocketConfig::default()
            .read_buffer_size(opts.read_buffer)
            .write_buffer_size(opts.write_buffer)
            .max_write_buffer_size(usize::MAX);
        let (ws, _resp) =
            tokio_tungstenite::client_async_with_config(url, stream, Some(config)).await?;
        Ok(Conn {
            ws,
            queue: VecDeque::new(),
        })
    }

    /// The local address of the TCP connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.ws.get_ref().local_addr().ok()
    }

    /// Sends one frame as one binary WebSocket message.
    pub async fn send(&mut self, f: &Frame) -> Result<(), ClientError> {
        self.ws.send(Message::Binary(im_proto::encode(f))).await?;
        Ok(())
    }

    /// Sends already-encoded bytes as one binary message (hot path, and bad input).
    pub async fn send_bytes(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        self.ws.send(Message::Binary(bytes.into())).await?;
        Ok(())
    }

    /// Sends a WebSocket-level ping carrying `payload`; its pong comes back as
    /// [`Event::WsPong`].
    pub async fn ws_ping(&mut self, payload: u64) -> Result<(), ClientError> {
        let data = payload.to_le_bytes().to_vec();
        self.ws.send(Message::Ping(data.into())).await?;
        Ok(())
    }

    /// Receives the next frame, pong or close. Cancel-safe (usable in `select!`).
    pub async fn recv(&mut self) -> Result<Event, ClientError> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Ok(Event::Frame(f));
            }
            // The only await point: nothing is lost if this future is dropped here.
            let msg = match self.ws.next().await {
                None => {
                    return Ok(Event::Closed {
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
                        Some(cf) => Event::Closed {
                            code: Some(u16::from(cf.code)),
                            reason: cf.reason.to_string(),
                        },
                        None => Event::Closed {
                            code: None,
                            reason: String::new(),
                        },
                    })
                }
                Message::Pong(p) => {
                    if let Ok(head) = <[u8; 8]>::try_from(p.as_ref()) {
                        return Ok(Event::WsPong(u64::from_le_bytes(head)));
                    }
                }
                // tungstenite queues the pong reply itself and flushes it on the next read.
                Message::Ping(_) | Message::Frame(_) => {}
                Message::Text(t) => {
                    return Err(ClientError::Protocol(format!(
                        "server sent a text message ({} bytes)",
                        t.len()
                    )))
                }
            }
        }
    }

    /// Sends `Login` (req_id 1) and waits up to `timeout` for `LoginOk`; an `Error`
    /// reply becomes `ClientError::Server`. Frames that arrive first stay queued.
    pub async fn login(
        &mut self,
        token: &str,
        device_id: &str,
        resume: bool,
        timeout: Duration,
    ) -> Result<LoginOk, ClientError> {
        const REQ_ID: u64 = 1;
        let login = Login {
            token: token.to_owned(),
            device_id: device_id.to_owned(),
            resume,
        };
        self.send(&im_proto::frame(REQ_ID, Body::Login(login)))
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
                Event::Closed { code, reason } => break Err(ClientError::Closed { code, reason }),
                Event::WsPong(_) => {}
                Event::Frame(f) => match f.body {
                    Some(Body::LoginOk(ok)) => break Ok(ok),
                    Some(Body::Error(e)) if f.req_id == REQ_ID || f.req_id == 0 => {
                        break Err(ClientError::from_server(e))
                    }
                    body => early.push(Frame {
                        req_id: f.req_id,
                        body,
                    }),
                },
            }
        };
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

    /// Kills the connection the way a dying client or network does: no close frame,
    /// and a TCP reset instead of an orderly FIN.
    pub fn abort(self) {
        let _ = self.ws.get_ref().set_zero_linger();
        drop(self);
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
fn closed_or_error(e: tungstenite::Error) -> Result<Event, ClientError> {
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
        Ok(Event::Closed {
            code: None,
            reason: e.to_string(),
        })
    } else {
        Err(e.into())
    }
}
