//! `RawConn`: a thin WebSocket connection speaking `im.v1` frames, for tests and tools.
//!
//! One binary WebSocket message is one encoded `Frame`. Received `Batch` frames are
//! unwrapped into their inner frames (returned one by one, in order); WebSocket-level
//! pings are answered and skipped, and so are pongs unless asked for. It is also the
//! transport under [`crate::Client`].
//!
//! [`RawConnOptions`] are what a load generator holding tens of thousands of sockets
//! needs (the bench uses them): a chosen source address (`TcpSocket::bind` before
//! `connect`, so connections can be spread over many loopback addresses and their number
//! is not capped by one address's ephemeral port range), small WebSocket buffers
//! (tungstenite allocates the read buffer eagerly: 128 KiB by default), WebSocket pings
//! whose pongs come back as [`RawEvent::WsPong`], and an abrupt kill ([`RawConn::abort`]).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use im_proto::{Body, Frame, Login, LoginOk, Message as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::error::ClientError;
use crate::tls::TlsConfig;

/// How long [`RawConn::login`] waits for `LoginOk`.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RawConn::close`] waits for the server's close reply.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How [`RawConn::connect_with`] opens its connection; the defaults are those of
/// [`RawConn::connect`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawConnOptions {
    addr: Option<SocketAddr>,
    local_ip: Option<IpAddr>,
    buffers: Option<(usize, usize)>,
    ws_pongs: bool,
    tls: Option<TlsConfig>,
}

impl RawConnOptions {
    /// The defaults: resolve the URL's host, let the OS pick the source address,
    /// tungstenite's buffers, pongs skipped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects to `addr` instead of resolving the URL's host (the handshake still
    /// names the URL's host).
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    /// Binds the socket to `ip` (any port) before connecting (`None`: the OS chooses).
    pub fn bind(mut self, ip: Option<IpAddr>) -> Self {
        self.local_ip = ip;
        self
    }

    /// WebSocket read and write buffer sizes in bytes (the read buffer is allocated
    /// up front and grows for larger messages).
    pub fn buffers(mut self, read: usize, write: usize) -> Self {
        self.buffers = Some((read, write));
        self
    }

    /// Returns the pongs to [`RawConn::ws_ping`] as [`RawEvent::WsPong`] (by default
    /// pongs are skipped).
    pub fn ws_pongs(mut self, on: bool) -> Self {
        self.ws_pongs = on;
        self
    }

    /// The TLS settings of a `wss://` URL (`None`: the Mozilla roots).
    pub fn tls(mut self, tls: Option<TlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// The connector of a `wss://` URL, when one is set.
    fn connector(&self) -> Option<Connector> {
        self.tls.as_ref().map(|t| Connector::Rustls(t.0.clone()))
    }

    /// Whether anything differs from [`RawConn::connect`]'s way of connecting.
    fn custom_socket(&self) -> bool {
        self.addr.is_some() || self.local_ip.is_some()
    }

    /// The WebSocket configuration, if the buffers are set.
    fn ws_config(&self) -> Option<WebSocketConfig> {
        self.buffers.map(|(read, write)| {
            WebSocketConfig::default()
                .read_buffer_size(read)
                .write_buffer_size(write)
                .max_write_buffer_size(usize::MAX)
        })
    }
}

/// What [`RawConn::recv`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum RawEvent {
    /// One frame from the server (batches already unwrapped).
    Frame(Frame),
    /// The pong to a [`RawConn::ws_ping`], with the ping's payload (only with
    /// [`RawConnOptions::ws_pongs`]).
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
pub struct RawConn {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    queue: VecDeque<Frame>,
    ws_pongs: bool,
}

impl std::fmt::Debug for RawConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConn")
            .field("queued_frames", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl RawConn {
    /// Opens a WebSocket to `url` (e.g. `ws://127.0.0.1:7070/ws`, or `wss://` trusting the
    /// Mozilla roots) with TCP_NODELAY set.
    pub async fn connect(url: &str) -> Result<RawConn, ClientError> {
        Self::connect_with(url, &RawConnOptions::default()).await
    }

    /// As [`RawConn::connect`], with `opts`: a given server address, a source
    /// address, buffer sizes, pongs surfaced.
    pub async fn connect_with(url: &str, opts: &RawConnOptions) -> Result<RawConn, ClientError> {
        let config = opts.ws_config();
        let ws = if opts.custom_socket() {
            let request = url.into_client_request()?;
            let addr = match opts.addr {
                Some(a) => a,
                None => resolve(request.uri()).await?,
            };
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
            // ws:// as it is; wss:// through rustls (the handshake names the URL's host).
            tokio_tungstenite::client_async_tls_with_config(
                request,
                stream,
                config,
                opts.connector(),
            )
            .await?
            .0
        } else {
            tokio_tungstenite::connect_async_tls_with_config(url, config, true, opts.connector())
                .await?
                .0
        };
        Ok(RawConn {
            ws,
            queue: VecDeque::new(),
            ws_pongs: opts.ws_pongs,
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

    /// Sends a WebSocket-level ping carrying `payload`; with
    /// [`RawConnOptions::ws_pongs`] its pong comes back as [`RawEvent::WsPong`].
    pub async fn ws_ping(&mut self, payload: u64) -> Result<(), ClientError> {
        let data = payload.to_le_bytes().to_vec();
        self.ws.send(Message::Ping(data.into())).await?;
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
                Message::Pong(p) if self.ws_pongs => {
                    if let Ok(head) = <[u8; 8]>::try_from(p.as_ref()) {
                        return Ok(RawEvent::WsPong(u64::from_le_bytes(head)));
                    }
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

    /// [`RawConn::login`] with an explicit request id and timeout.
    pub async fn login_with(
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
                RawEvent::WsPong(_) => {}
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

    /// Kills the connection the way a dying client or network does: no close frame,
    /// and a TCP reset instead of an orderly FIN (on a plain TCP connection).
    pub fn abort(self) {
        if let MaybeTlsStream::Plain(tcp) = self.ws.get_ref() {
            let _ = tcp.set_zero_linger();
        }
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

fn io_error(e: std::io::Error) -> ClientError {
    ClientError::from(tungstenite::Error::Io(e))
}

/// The first address of a `ws://` / `wss://` URL's host and port.
async fn resolve(uri: &tungstenite::http::Uri) -> Result<SocketAddr, ClientError> {
    let no_host = || tungstenite::Error::Url(tungstenite::error::UrlError::NoHostName);
    let host = uri
        .host()
        .ok_or_else(no_host)?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("wss") => 443,
        _ => 80,
    });
    tokio::net::lookup_host((host, port))
        .await
        .map_err(io_error)?
        .next()
        .ok_or_else(|| no_host().into())
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
