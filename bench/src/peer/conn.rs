//! One client connection of the peer adapter, whatever the protocol: `im` (an
//! `im_client::RawConn` logged in with a minted token), `mqtt-ws` (MQTT 3.1.1 over a
//! WebSocket with subprotocol `mqtt`) or `nats-ws` (the NATS text protocol over a
//! WebSocket). It opens, subscribes, publishes with or without an ack, and turns what
//! the server sends into [`Event`]s: a delivered payload, or the ack of a publish.
//!
//! Acks: `im` a SendAck (the message is committed to SQLite and fsync'd), `mqtt-ws` a
//! PUBACK of a QoS 1 PUBLISH, `nats-ws` the PONG to a PING sent right after the PUB
//! (the server has processed the PUB; NATS core keeps nothing).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use im_client::{RawConn, RawEvent};
use im_proto::{send, Body, DeliverAck, MessageType, Send};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{mqtt, nats, Protocol};
use crate::target::{Dialer, READ_BUFFER, WRITE_BUFFER};

/// How long CONNECT/login and SUBSCRIBE wait for their answer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// MQTT keepalive asked for (the connection sends PINGREQ at half of it).
pub const MQTT_KEEPALIVE: u16 = 60;

/// Where a publish goes.
#[derive(Debug, Clone)]
pub enum Dest {
    /// A topic/subject shared by many subscribers (im: a group).
    Fanout(String),
    /// One receiver's topic/subject (im: a one-to-one message to this user).
    One(String),
}

/// What the server sent, as the scenarios see it.
#[derive(Debug)]
pub enum Event {
    /// A delivered payload.
    Delivered(Vec<u8>),
    /// The ack of the publish that returned this key.
    Acked(u64),
    /// The connection ended (why).
    Closed(String),
}

/// A connection of any protocol.
pub enum PeerConn {
    /// im-server.
    Im {
        /// The connection.
        conn: Box<RawConn>,
        /// Next req_id.
        next_req: u64,
        /// Send DeliverAck for deliveries (pairs).
        ack_deliveries: bool,
        /// Events decoded, not yet returned.
        queue: VecDeque<Event>,
    },
    /// Mosquitto (or any MQTT 3.1.1 broker) over WebSocket.
    Mqtt {
        /// The WebSocket.
        ws: Box<WebSocketStream<MaybeTlsStream<TcpStream>>>,
        /// Packet reassembly.
        dec: mqtt::Decoder,
        /// Next packet id (1..=65535).
        next_id: u16,
        /// Events decoded, not yet returned.
        queue: VecDeque<Event>,
    },
    /// nats-server over WebSocket.
    Nats {
        /// The WebSocket.
        ws: Box<WebSocketStream<MaybeTlsStream<TcpStream>>>,
        /// Operation reassembly.
        dec: nats::Decoder,
        /// Keys of publishes whose PONG is outstanding, in order.
        pongs: VecDeque<u64>,
        /// Next publish key.
        next_key: u64,
        /// Next subscription id.
        next_sid: u64,
        /// Events decoded, not yet returned.
        queue: VecDeque<Event>,
    },
}

impl std::fmt::Debug for PeerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerConn::Im { .. } => "PeerConn::Im",
            PeerConn::Mqtt { .. } => "PeerConn::Mqtt",
            PeerConn::Nats { .. } => "PeerConn::Nats",
        })
    }
}

/// Opens a WebSocket to `url` at `addr` from `local_ip`, with `subprotocol`.
async fn open_ws(
    url: &str,
    addr: SocketAddr,
    local_ip: Option<IpAddr>,
    subprotocol: Option<&str>,
) -> anyhow::Result<WebSocketStream<MaybeTlsStream<TcpStream>>> {
    let mut request = url.into_client_request().context("WebSocket URL")?;
    if let Some(p) = subprotocol {
        request
            .headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(p)?);
    }
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }?;
    if let Some(ip) = local_ip {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket
        .connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(usize::MAX);
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        request,
        MaybeTlsStream::Plain(stream),
        Some(config),
    )
    .await
    .context("WebSocket handshake")?;
    Ok(ws)
}

/// Where and how to open connections.
#[derive(Debug, Clone)]
pub struct Opener {
    /// The protocol.
    pub protocol: Protocol,
    /// WebSocket URL.
    pub url: String,
    /// Resolved server address.
    pub addr: SocketAddr,
    /// Loopback source addresses (empty: the OS chooses).
    pub sources: Vec<IpAddr>,
    /// For `im`: opens logged-in sessions.
    pub dialer: Dialer,
}

impl Opener {
    /// Opens connection number `idx` as `name` (im user id, MQTT client id, NATS name),
    /// authenticated (im: logged in; MQTT: CONNACK; NATS: CONNECT answered by PONG).
    pub async fn open(&self, idx: usize, name: &str) -> anyhow::Result<PeerConn> {
        let local_ip = (!self.sources.is_empty()).then(|| self.sources[idx % self.sources.len()]);
        match self.protocol {
            Protocol::Im => {
                let token = self.dialer.token(name)?;
                let (s, _) = self
                    .dialer
                    .open(idx, &token)
                    .await
                    .with_context(|| format!("logging in {name}"))?;
                Ok(PeerConn::Im {
                    conn: Box::new(s.conn),
                    next_req: 100,
                    ack_deliveries: false,
                    queue: VecDeque::new(),
                })
            }
            Protocol::MqttWs => {
                let mut ws = open_ws(&self.url, self.addr, local_ip, Some("mqtt")).await?;
                ws.send(Message::Binary(mqtt::connect(name, MQTT_KEEPALIVE).into()))
                    .await?;
                let mut dec = mqtt::Decoder::default();
                let code = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                    loop {
                        if let Some(p) = dec.next_packet()? {
                            match p {
                                mqtt::Packet::ConnAck { code } => return anyhow::Ok(code),
                                other => bail!("expected CONNACK, got {other:?}"),
                            }
                        }
                        match ws.next().await {
                            Some(Ok(Message::Binary(b))) => dec.push(&b),
                            Some(Ok(Message::Close(c))) => bail!("closed before CONNACK: {c:?}"),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => bail!("before CONNACK: {e}"),
                            None => bail!("closed before CONNACK"),
                        }
                    }
                })
                .await
                .context("no CONNACK in time")??;
                if code != 0 {
                    bail!("CONNACK refused with code {code}");
                }
                Ok(PeerConn::Mqtt {
                    ws: Box::new(ws),
                    dec,
                    next_id: 1,
                    queue: VecDeque::new(),
                })
            }
            Protocol::NatsWs => {
                let ws = open_ws(&self.url, self.addr, local_ip, None).await?;
                let mut c = PeerConn::Nats {
                    ws: Box::new(ws),
                    dec: nats::Decoder::default(),
                    pongs: VecDeque::new(),
                    next_key: 1,
                    next_sid: 1,
                    queue: VecDeque::new(),
                };
                let mut hello = nats::connect(name);
                hello.extend(nats::ping());
                c.write(hello).await?;
                c.round_trip().await.context("CONNECT")?;
                Ok(c)
            }
        }
    }
}

impl PeerConn {
    /// Writes raw protocol bytes as one binary message (MQTT and NATS).
    async fn write(&mut self, bytes: Vec<u8>) -> anyhow::Result<()> {
        match self {
            PeerConn::Mqtt { ws, .. } | PeerConn::Nats { ws, .. } => {
                ws.send(Message::Binary(bytes.into())).await?;
                Ok(())
            }
            PeerConn::Im { .. } => bail!("raw write on an im connection"),
        }
    }

    /// NATS: waits for the PONG of the PING just written (deliveries that come first
    /// stay queued, in order).
    async fn round_trip(&mut self) -> anyhow::Result<()> {
        let key = match self {
            PeerConn::Nats {
                pongs, next_key, ..
            } => {
                let k = *next_key;
                *next_key += 1;
                pongs.push_back(k);
                k
            }
            _ => return Ok(()),
        };
        let mut early = Vec::new();
        let result = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            loop {
                match self.recv().await {
                    Event::Acked(k) if k == key => return anyhow::Ok(()),
                    Event::Closed(why) => bail!("closed: {why}"),
                    ev @ Event::Delivered(_) => early.push(ev),
                    Event::Acked(_) => {}
                }
            }
        })
        .await
        .context("no PONG in time");
        if let PeerConn::Nats { queue, .. } = self {
            for ev in early.into_iter().rev() {
                queue.push_front(ev);
            }
        }
        result?
    }

    /// im: whether deliveries are answered with DeliverAck (as a pairs receiver does).
    pub fn set_ack_deliveries(&mut self, on: bool) {
        if let PeerConn::Im { ack_deliveries, .. } = self {
            *ack_deliveries = on;
        }
    }

    /// Subscribes to `topic` (MQTT at `qos`) and waits until the server confirms it
    /// (SUBACK; NATS: the PONG of a PING after SUB). No-op for im (membership is
    /// server-side).
    pub async fn subscribe(&mut self, topic: &str, qos: u8) -> anyhow::Result<()> {
        match self {
            PeerConn::Im { .. } => Ok(()),
            PeerConn::Mqtt { next_id, .. } => {
                let id = *next_id;
                *next_id = next_id.checked_add(1).unwrap_or(1);
                self.write(mqtt::subscribe(id, topic, qos)).await?;
                let PeerConn::Mqtt { ws, dec, .. } = self else {
                    unreachable!("matched above")
                };
                tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                    loop {
                        while let Some(p) = dec.next_packet()? {
                            if let mqtt::Packet::SubAck { id: got, codes } = p {
                                if got == id {
                                    if codes.iter().any(|c| *c >= 0x80) {
                                        bail!("SUBSCRIBE {topic} refused");
                                    }
                                    return Ok(());
                                }
                            }
                        }
                        match ws.next().await {
                            Some(Ok(Message::Binary(b))) => dec.push(&b),
                            Some(Ok(_)) => {}
                            Some(Err(e)) => bail!("before SUBACK: {e}"),
                            None => bail!("closed before SUBACK"),
                        }
                    }
                })
                .await
                .context("no SUBACK in time")?
            }
            PeerConn::Nats { next_sid, .. } => {
                let sid = *next_sid;
                *next_sid += 1;
                let mut bytes = nats::sub(topic, sid);
                bytes.extend(nats::ping());
                self.write(bytes).await?;
                self.round_trip().await
            }
        }
    }

    /// Publishes `payload` to `dest`; with `ack`, the returned key comes back as
    /// [`Event::Acked`] (MQTT QoS 1 PUBACK, NATS PONG, im SendAck). im always acks.
    pub async fn publish(
        &mut self,
        dest: &Dest,
        payload: Vec<u8>,
        ack: bool,
    ) -> anyhow::Result<u64> {
        match self {
            PeerConn::Im { conn, next_req, .. } => {
                let req = *next_req;
                *next_req += 1;
                let target = match dest {
                    Dest::Fanout(g) => send::Target::GroupId(g.clone()),
                    Dest::One(u) => send::Target::ToUser(u.clone()),
                };
                let f = im_proto::frame(
                    req,
                    Body::Send(Send {
                        r#type: MessageType::Text as i32,
                        payload: payload.into(),
                        client_msg_id: format!("{req:032x}"),
                        target: Some(target),
                    }),
                );
                conn.send(&f).await?;
                Ok(req)
            }
            PeerConn::Mqtt { next_id, .. } => {
                let topic = match dest {
                    Dest::Fanout(t) | Dest::One(t) => t,
                };
                let id = ack.then(|| {
                    let id = *next_id;
                    *next_id = next_id.checked_add(1).unwrap_or(1);
                    id
                });
                let bytes = mqtt::publish(topic, id, &payload);
                self.write(bytes).await?;
                Ok(id.map_or(0, u64::from))
            }
            PeerConn::Nats {
                pongs, next_key, ..
            } => {
                let subject = match dest {
                    Dest::Fanout(t) | Dest::One(t) => t,
                };
                let mut bytes = nats::publish(subject, &payload);
                let mut key = 0;
                if ack {
                    key = *next_key;
                    *next_key += 1;
                    pongs.push_back(key);
                    bytes.extend(nats::ping());
                }
                self.write(bytes).await?;
                Ok(key)
            }
        }
    }

    /// Keeps the connection alive while idle: im Ping, MQTT PINGREQ (NATS answers the
    /// server's PINGs in [`PeerConn::recv`]).
    pub async fn keepalive(&mut self) -> anyhow::Result<()> {
        match self {
            PeerConn::Im { conn, .. } => Ok(crate::run::ping(conn).await?),
            PeerConn::Mqtt { .. } => self.write(mqtt::pingreq()).await,
            PeerConn::Nats { .. } => Ok(()),
        }
    }

    /// The next event. Cancel-safe between events: decoded events are queued before
    /// any await.
    pub async fn recv(&mut self) -> Event {
        loop {
            let queued = match self {
                PeerConn::Im { queue, .. }
                | PeerConn::Mqtt { queue, .. }
                | PeerConn::Nats { queue, .. } => queue.pop_front(),
            };
            if let Some(ev) = queued {
                return ev;
            }
            if let Err(e) = self.fill().await {
                return Event::Closed(format!("{e:#}"));
            }
        }
    }

    /// Reads one message from the server and queues its events.
    async fn fill(&mut self) -> anyhow::Result<()> {
        match self {
            PeerConn::Im {
                conn,
                queue,
                ack_deliveries,
                ..
            } => match conn.recv().await? {
                RawEvent::Frame(f) => match f.body {
                    Some(Body::Deliver(d)) => {
                        let last = d
                            .messages
                            .last()
                            .map(|m| (m.conversation_id.clone(), m.seq));
                        for m in d.messages {
                            queue.push_back(Event::Delivered(m.payload.to_vec()));
                        }
                        if let (true, Some((conversation_id, seq))) = (*ack_deliveries, last) {
                            conn.send(&im_proto::frame(
                                0,
                                Body::DeliverAck(DeliverAck {
                                    conversation_id,
                                    seq,
                                }),
                            ))
                            .await?;
                        }
                        Ok(())
                    }
                    Some(Body::SendAck(_)) => {
                        queue.push_back(Event::Acked(f.req_id));
                        Ok(())
                    }
                    Some(Body::Error(e)) => bail!("server error {} {}", e.code, e.message),
                    _ => Ok(()),
                },
                RawEvent::WsPong(_) => Ok(()),
                RawEvent::Closed { code, reason } => bail!("closed ({code:?}): {reason}"),
            },
            PeerConn::Mqtt { ws, dec, queue, .. } => {
                let msg = match ws.next().await {
                    Some(m) => m?,
                    None => bail!("connection ended"),
                };
                match msg {
                    Message::Binary(b) => dec.push(&b),
                    Message::Close(c) => bail!("closed: {c:?}"),
                    _ => return Ok(()),
                }
                let mut pubacks = Vec::new();
                while let Some(p) = dec.next_packet()? {
                    match p {
                        mqtt::Packet::Publish { id, payload, .. } => {
                            if let Some(id) = id {
                                pubacks.extend(mqtt::puback(id));
                            }
                            queue.push_back(Event::Delivered(payload));
                        }
                        mqtt::Packet::PubAck { id } => queue.push_back(Event::Acked(id.into())),
                        _ => {}
                    }
                }
                if !pubacks.is_empty() {
                    ws.send(Message::Binary(pubacks.into())).await?;
                }
                Ok(())
            }
            PeerConn::Nats {
                ws,
                dec,
                queue,
                pongs,
                ..
            } => {
                let msg = match ws.next().await {
                    Some(m) => m?,
                    None => bail!("connection ended"),
                };
                match msg {
                    Message::Binary(b) => dec.push(&b),
                    Message::Text(t) => dec.push(t.as_bytes()),
                    Message::Close(c) => bail!("closed: {c:?}"),
                    _ => return Ok(()),
                }
                let mut reply = false;
                while let Some(op) = dec.next_op()? {
                    match op {
                        nats::Op::Msg { payload, .. } => queue.push_back(Event::Delivered(payload)),
                        nats::Op::Pong => {
                            if let Some(k) = pongs.pop_front() {
                                queue.push_back(Event::Acked(k));
                            }
                        }
                        nats::Op::Ping => reply = true,
                        nats::Op::Err(e) => bail!("-ERR {e}"),
                        _ => {}
                    }
                }
                if reply {
                    ws.send(Message::Binary(nats::pong().into())).await?;
                }
                Ok(())
            }
        }
    }

    /// Closes politely (MQTT DISCONNECT, WebSocket close).
    pub async fn close(mut self) {
        match &mut self {
            PeerConn::Im { conn, .. } => {
                let _ = conn.close().await;
            }
            PeerConn::Mqtt { ws, .. } => {
                let _ = ws.send(Message::Binary(mqtt::disconnect().into())).await;
                let _ = SinkExt::close(&mut **ws).await;
            }
            PeerConn::Nats { ws, .. } => {
                let _ = SinkExt::close(&mut **ws).await;
            }
        }
    }
}
