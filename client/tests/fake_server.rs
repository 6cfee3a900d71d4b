//! SDK behaviour against a scripted in-process fake server (no im-server needed): batch
//! unwrapping, req_id correlation, OVERLOADED retries, dedup + gap sync + DeliverAck,
//! paged sync, reconnect with resume and resend, heartbeats, and per-conversation order
//! when pushes of one conversation arrive out of seq order (as from two cluster nodes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use im_client::proto::{self, Body, ChatMessage, ErrorCode, Frame, Message as _};
use im_client::{
    Client, ClientConfig, ClientError, Event, RawConn, RawConnOptions, RawEvent, Target,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const WAIT: Duration = Duration::from_secs(5);

/// The server side of one accepted connection.
struct Peer {
    ws: WebSocketStream<TcpStream>,
}

impl Peer {
    /// Next binary frame from the client; `None` once it closed.
    async fn recv(&mut self) -> Option<Frame> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("client sent nothing in time")?
                .ok()?;
            match msg {
                Message::Binary(b) => return Some(Frame::decode(b).expect("client frame")),
                Message::Close(_) => return None,
                _ => {}
            }
        }
    }

    /// Next frame that is not a heartbeat ping or a DeliverAck.
    async fn recv_request(&mut self) -> Frame {
        loop {
            let f = self.recv().await.expect("connection closed");
            match f.body {
                Some(Body::Ping(_) | Body::DeliverAck(_)) => {}
                _ => return f,
            }
        }
    }

    /// Next frame within `wait`; `None` when nothing came (or the connection closed).
    async fn try_recv(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, self.recv())
            .await
            .unwrap_or_default()
    }

    async fn send(&mut self, f: Frame) {
        self.ws
            .send(Message::Binary(proto::encode(&f)))
            .await
            .expect("send");
    }

    /// Reads the Login and answers LoginOk for `user` on `node`.
    async fn accept_login(&mut self, user: &str, node: &str, heartbeat_secs: u32) -> proto::Login {
        let f = self.recv().await.expect("login frame");
        let Some(Body::Login(login)) = f.body else {
            panic!("first frame is not Login: {f:?}")
        };
        let ok = proto::LoginOk {
            user_id: user.into(),
            session_id: format!("s-{node}"),
            heartbeat_secs,
            node_id: node.into(),
        };
        self.send(proto::frame(f.req_id, Body::LoginOk(ok))).await;
        login
    }
}

/// A listener handing each accepted WebSocket to the test.
async fn fake_server() -> (String, mpsc::UnboundedReceiver<Peer>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}/ws", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                let _ = tx.send(Peer { ws });
            }
        }
    });
    (url, rx)
}

async fn next_peer(peers: &mut mpsc::UnboundedReceiver<Peer>) -> Peer {
    tokio::time::timeout(WAIT, peers.recv())
        .await
        .expect("no connection in time")
        .expect("listener gone")
}

fn msg(conv: &str, seq: u64) -> ChatMessage {
    ChatMessage {
        conversation_id: conv.into(),
        sender: "alice".into(),
        payload: format!("m{seq}").into(),
        send_time: 1,
        r#type: proto::MessageType::Text as i32,
        seq,
        msg_id: format!("id-{conv}-{seq}"),
        client_msg_id: String::new(),
        ..Default::default()
    }
}

fn deliver(msgs: Vec<ChatMessage>) -> Frame {
    proto::frame(0, Body::Deliver(proto::Deliver { messages: msgs }))
}

fn config(url: &str) -> ClientConfig {
    let mut cfg = ClientConfig::new(url, "tok");
    cfg.reconnect_min = Duration::from_millis(10);
    cfg.reconnect_max = Duration::from_millis(50);
    cfg.request_timeout = Duration::from_secs(5);
    cfg
}

async fn connect(
    url: &str,
    cfg: ClientConfig,
    peers: &mut mpsc::UnboundedReceiver<Peer>,
) -> (Client, Peer) {
    let _ = url;
    let (client, peer) = tokio::join!(Client::connect(cfg), async {
        let mut p = next_peer(peers).await;
        p.accept_login("bob", "n1", 30).await;
        p
    });
    (client.expect("connect"), peer)
}

async fn next_event(c: &Client) -> Event {
    tokio::time::timeout(WAIT, c.next_event())
        .await
        .expect("no event in time")
        .expect("event stream ended")
}

fn cursors_of(req: &proto::SyncRequest) -> Vec<(String, u64)> {
    req.cursors
        .iter()
        .map(|c| (c.conversation_id.clone(), c.after_seq))
        .collect()
}

fn seq_of(e: &Event) -> u64 {
    match e {
        Event::Message(m) => m.seq,
        other => panic!("expected a message, got {other:?}"),
    }
}

#[tokio::test]
async fn raw_conn_unwraps_batches_and_reports_close() {
    let (url, mut peers) = fake_server().await;
    let server = tokio::spawn(async move {
        let mut p = next_peer(&mut peers).await;
        let f = p.recv().await.expect("login");
        assert_eq!(f.req_id, 1);
        let ok = proto::frame(
            1,
            Body::LoginOk(proto::LoginOk {
                user_id: "bob".into(),
                ..Default::default()
            }),
        );
        let a = proto::encode(&ok);
        let b = proto::encode(&deliver(vec![msg("u:alice:bob", 1)]));
        let batch = proto::encode_batch([a.as_ref(), b.as_ref()]);
        p.ws.send(Message::Binary(batch)).await.expect("batch");
        p.ws.send(Message::Ping(vec![1, 2].into()))
            .await
            .expect("ping");
        // The client's text message arrives as text.
        let text = p.ws.next().await.expect("text").expect("text ok");
        assert!(matches!(text, Message::Text(_)));
        // The WebSocket ping was answered by the client while it read.
        let pong = p.ws.next().await.expect("pong").expect("pong ok");
        assert_eq!(pong, Message::Pong(vec![1, 2].into()));
        p.ws.send(Message::Close(Some(CloseFrame {
            code: CloseCode::from(4000),
            reason: "bye".into(),
        })))
        .await
        .expect("close");
    });
    let mut raw = RawConn::connect(&url).await.expect("connect");
    let ok = raw.login("tok", "d1", false).await.expect("login");
    assert_eq!(ok.user_id, "bob");
    match raw.recv_timeout(WAIT).await.expect("deliver") {
        RawEvent::Frame(Frame {
            body: Some(Body::Deliver(d)),
            ..
        }) => assert_eq!(d.messages[0].seq, 1),
        other => panic!("expected deliver, got {other:?}"),
    }
    raw.send_text("not a frame".into()).await.expect("text");
    assert_eq!(
        raw.recv_timeout(WAIT).await.expect("close"),
        RawEvent::Closed {
            code: Some(4000),
            reason: "bye".into()
        }
    );
    server.await.expect("server");
    assert!(matches!(
        raw.recv_timeout(Duration::from_millis(10)).await,
        Ok(RawEvent::Closed { .. }) | Err(_)
    ));
}

#[tokio::test]
async fn raw_conn_rejects_undecodable_server_bytes() {
    let (url, mut peers) = fake_server().await;
    let server = tokio::spawn(async move {
        let mut p = next_peer(&mut peers).await;
        p.ws.send(Message::Binary(vec![0xff, 0xff, 0xff].into()))
            .await
            .expect("send");
        p
    });
    let mut raw = RawConn::connect(&url).await.expect("connect");
    assert!(matches!(
        raw.recv_timeout(WAIT).await,
        Err(ClientError::Decode(_))
    ));
    drop(server.await);
    assert!(matches!(
        RawConn::connect("ws://127.0.0.1:1/ws").await,
        Err(ClientError::WebSocket(_))
    ));
}

#[tokio::test]
async fn raw_conn_options_bind_size_buffers_and_surface_pongs() {
    let (url, mut peers) = fake_server().await;
    let addr: std::net::SocketAddr = url
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .parse()
        .expect("addr");
    let source: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let opts = RawConnOptions::new()
        .addr(addr)
        .bind(Some(source))
        .buffers(8 * 1024, 4 * 1024)
        .ws_pongs(true);
    let (raw, peer) = tokio::join!(RawConn::connect_with(&url, &opts), next_peer(&mut peers));
    let mut raw = raw.expect("connect with options");
    let mut peer = peer;
    assert_eq!(
        peer.ws.get_ref().peer_addr().expect("peer").ip(),
        source,
        "the connection comes from the bound source address"
    );
    // The fake server answers pings while it reads.
    let server = tokio::spawn(async move { while peer.recv().await.is_some() {} });
    raw.ws_ping(42).await.expect("ping");
    assert_eq!(
        raw.recv_timeout(WAIT).await.expect("pong"),
        RawEvent::WsPong(42)
    );
    // Without the option, pongs are skipped.
    let (plain, peer) = tokio::join!(RawConn::connect(&url), next_peer(&mut peers));
    let mut plain = plain.expect("connect");
    let server2 = tokio::spawn(async move {
        let mut peer = peer;
        while peer.recv().await.is_some() {}
    });
    plain.ws_ping(7).await.expect("ping");
    assert!(matches!(
        plain.recv_timeout(Duration::from_millis(300)).await,
        Err(ClientError::Timeout)
    ));
    raw.abort();
    let _ = plain.close().await;
    let _ = tokio::join!(server, server2);
    assert!(matches!(
        RawConn::connect_with("wss://127.0.0.1:1/ws", &RawConnOptions::new().addr(addr)).await,
        Err(ClientError::WebSocket(_))
    ));
}

#[tokio::test]
async fn first_login_failure_fails_fast() {
    let (url, mut peers) = fake_server().await;
    let server = tokio::spawn(async move {
        let mut p = next_peer(&mut peers).await;
        let f = p.recv().await.expect("login");
        p.send(proto::error_frame(
            f.req_id,
            ErrorCode::Unauthenticated,
            "bad token",
        ))
        .await;
        p
    });
    let err = Client::connect(config(&url)).await.expect_err("must fail");
    assert_eq!(err.server_code(), Some(ErrorCode::Unauthenticated));
    drop(server.await);
}

#[tokio::test]
async fn send_retries_overload_with_the_same_client_msg_id() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    assert_eq!(client.user_id(), "bob");
    assert_eq!(client.node_id(), "n1");
    let client = Arc::new(client);
    let c2 = client.clone();
    let sending = tokio::spawn(async move { c2.send_text("alice", "hi").await });

    let first = peer.recv_request().await;
    let Some(Body::Send(s1)) = first.body else {
        panic!("expected Send, got {first:?}")
    };
    assert_eq!(s1.target, Some(proto::send::Target::ToUser("alice".into())));
    let mut overloaded = proto::error_frame(first.req_id, ErrorCode::Overloaded, "busy");
    if let Some(Body::Error(e)) = overloaded.body.as_mut() {
        e.retry_after_ms = 5;
    }
    peer.send(overloaded).await;

    let second = peer.recv_request().await;
    let Some(Body::Send(s2)) = second.body else {
        panic!("expected Send, got {second:?}")
    };
    assert_ne!(first.req_id, second.req_id);
    assert_eq!(s1.client_msg_id, s2.client_msg_id);
    assert!(!s1.client_msg_id.is_empty());
    let ack = proto::SendAck {
        client_msg_id: s2.client_msg_id.clone(),
        msg_id: "m-1".into(),
        conversation_id: "u:alice:bob".into(),
        seq: 1,
        server_time: 2,
        duplicate: false,
    };
    peer.send(proto::frame(second.req_id, Body::SendAck(ack.clone())))
        .await;
    assert_eq!(sending.await.expect("join").expect("ack"), ack);

    // A failed commit (INTERNAL with a retry hint: nothing was stored) is retried too.
    let c4 = client.clone();
    let sending = tokio::spawn(async move { c4.send_text("alice", "again").await });
    let f1 = peer.recv_request().await;
    let mut failed = proto::error_frame(f1.req_id, ErrorCode::Internal, "store unavailable");
    if let Some(Body::Error(e)) = failed.body.as_mut() {
        e.retry_after_ms = 5;
    }
    peer.send(failed).await;
    let f2 = peer.recv_request().await;
    let (Some(Body::Send(a)), Some(Body::Send(b))) = (f1.body, f2.body) else {
        panic!("expected two Sends")
    };
    assert_eq!(a.client_msg_id, b.client_msg_id);
    let ack2 = proto::SendAck {
        client_msg_id: b.client_msg_id.clone(),
        msg_id: "m-2".into(),
        conversation_id: "u:alice:bob".into(),
        seq: 2,
        server_time: 3,
        duplicate: false,
    };
    peer.send(proto::frame(f2.req_id, Body::SendAck(ack2.clone())))
        .await;
    assert_eq!(sending.await.expect("join").expect("ack"), ack2);

    // An INTERNAL without a hint is returned as it is.
    let c5 = client.clone();
    let sending = tokio::spawn(async move { c5.send_text("alice", "no hint").await });
    let f = peer.recv_request().await;
    peer.send(proto::error_frame(f.req_id, ErrorCode::Internal, "bug"))
        .await;
    let err = sending.await.expect("join").expect_err("internal");
    assert_eq!(err.server_code(), Some(ErrorCode::Internal));

    // Other errors are returned as they are.
    let c3 = client.clone();
    let sending = tokio::spawn(async move {
        c3.send(
            Target::Group("g1".into()),
            proto::MessageType::Text,
            "x",
            Some("mine".into()),
        )
        .await
    });
    let f = peer.recv_request().await;
    peer.send(proto::error_frame(f.req_id, ErrorCode::NotMember, "no"))
        .await;
    let err = sending.await.expect("join").expect_err("not member");
    assert_eq!(err.server_code(), Some(ErrorCode::NotMember));
}

#[tokio::test]
async fn deliveries_are_deduped_gaps_synced_and_acked() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let conv = "u:alice:bob";
    peer.send(deliver(vec![msg(conv, 1), msg(conv, 2), msg(conv, 2)]))
        .await;
    assert_eq!(seq_of(&next_event(&client).await), 1);
    assert_eq!(seq_of(&next_event(&client).await), 2);
    // Seq 4 arrives above a gap: it is held, and the gap triggers a background sync from
    // the last seq the app has.
    peer.send(deliver(vec![msg(conv, 4)])).await;
    let f = peer.recv_request().await;
    let Some(Body::Sync(req)) = f.body else {
        panic!("expected SyncRequest, got {f:?}")
    };
    assert_eq!(cursors_of(&req), vec![(conv.to_owned(), 2)]);
    assert_eq!(req.limit, 500);
    let page = proto::SyncResponse {
        messages: vec![msg(conv, 3), msg(conv, 4)],
        more: false,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
        .await;
    // The sync fills the gap, then the held message follows: the app sees seq order.
    assert_eq!(seq_of(&next_event(&client).await), 3);
    assert_eq!(seq_of(&next_event(&client).await), 4);

    // DeliverAcks are cumulative and end at the contiguous mark.
    let mut acked = 0;
    while acked < 4 {
        let f = peer.recv().await.expect("ack");
        if let Some(Body::DeliverAck(a)) = f.body {
            assert_eq!(a.conversation_id, conv);
            assert!(a.seq > acked && a.seq <= 4, "ack {} after {acked}", a.seq);
            acked = a.seq;
        }
    }
    assert!(client.try_next_event().is_none());
    client.close().await;
    // Close is a WebSocket close.
    assert!(peer.recv().await.is_none());
}

#[tokio::test]
async fn sync_pages_with_explicit_cursors_and_returns_only_new() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let client = Arc::new(client);
    let c2 = client.clone();
    let syncing = tokio::spawn(async move { c2.sync().await });

    let f = peer.recv_request().await;
    let Some(Body::Sync(req)) = f.body else {
        panic!("expected SyncRequest, got {f:?}")
    };
    assert!(req.cursors.is_empty());
    let page = proto::SyncResponse {
        messages: vec![msg("g:a", 1), msg("g:a", 2), msg("u:alice:bob", 1)],
        more: true,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
        .await;
    let f = peer.recv_request().await;
    let Some(Body::Sync(mut req)) = f.body else {
        panic!("expected SyncRequest, got {f:?}")
    };
    req.cursors
        .sort_by(|a, b| a.conversation_id.cmp(&b.conversation_id));
    assert_eq!(
        cursors_of(&req),
        vec![("g:a".to_owned(), 2), ("u:alice:bob".to_owned(), 1)]
    );
    let page = proto::SyncResponse {
        messages: vec![msg("u:alice:bob", 2)],
        more: false,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
        .await;
    let got = syncing.await.expect("join").expect("sync");
    assert_eq!(got.len(), 4);
    for _ in 0..4 {
        assert!(matches!(next_event(&client).await, Event::Message(_)));
    }

    // A second sync that only returns known messages yields nothing new.
    let c2 = client.clone();
    let syncing = tokio::spawn(async move { c2.sync().await });
    let f = peer.recv_request().await;
    let page = proto::SyncResponse {
        messages: vec![msg("u:alice:bob", 2)],
        more: false,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
        .await;
    assert!(syncing.await.expect("join").expect("sync").is_empty());
    assert!(client.try_next_event().is_none());
}

#[tokio::test]
async fn reconnect_resumes_resends_in_flight_send_and_syncs() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let client = Arc::new(client);

    let c2 = client.clone();
    let sending = tokio::spawn(async move { c2.send_text("alice", "hello").await });
    let c3 = client.clone();
    let pinging = tokio::spawn(async move { c3.ping().await });
    let mut sent_cmid = None;
    let mut got_ping = false;
    while sent_cmid.is_none() || !got_ping {
        let f = peer.recv().await.expect("frame");
        match f.body {
            Some(Body::Send(s)) => sent_cmid = Some(s.client_msg_id),
            Some(Body::Ping(_)) => got_ping = true,
            _ => {}
        }
    }
    let sent_cmid = sent_cmid.expect("send seen");
    drop(peer); // the connection drops with the send and the ping in flight

    assert!(matches!(
        next_event(&client).await,
        Event::Disconnected { .. }
    ));
    assert!(matches!(
        pinging.await.expect("join"),
        Err(ClientError::Disconnected)
    ));
    let mut peer = next_peer(&mut peers).await;
    let login = peer.accept_login("bob", "n2", 30).await;
    assert!(login.resume);
    assert_eq!(
        next_event(&client).await,
        Event::Reconnected {
            node_id: "n2".into()
        }
    );
    assert_eq!(client.node_id(), "n2");

    let mut got_send = false;
    let mut got_sync = false;
    while !(got_send && got_sync) {
        let f = peer.recv_request().await;
        match f.body {
            Some(Body::Send(s)) => {
                assert_eq!(s.client_msg_id, sent_cmid);
                let ack = proto::SendAck {
                    client_msg_id: s.client_msg_id,
                    msg_id: "m-9".into(),
                    conversation_id: "u:alice:bob".into(),
                    seq: 9,
                    server_time: 3,
                    duplicate: true,
                };
                peer.send(proto::frame(f.req_id, Body::SendAck(ack))).await;
                got_send = true;
            }
            Some(Body::Sync(req)) => {
                assert!(req.cursors.is_empty());
                let page = proto::SyncResponse {
                    messages: vec![msg("u:alice:bob", 7)],
                    more: false,
                    ..Default::default()
                };
                peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
                    .await;
                got_sync = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let ack = sending.await.expect("join").expect("ack after reconnect");
    assert!(ack.duplicate);
    assert_eq!(ack.seq, 9);
    assert_eq!(seq_of(&next_event(&client).await), 7);
}

#[tokio::test]
async fn without_auto_reconnect_in_flight_requests_fail_and_events_end() {
    let (url, mut peers) = fake_server().await;
    let mut cfg = config(&url);
    cfg.auto_reconnect = false;
    let (client, mut peer) = connect(&url, cfg, &mut peers).await;
    let client = Arc::new(client);
    let c2 = client.clone();
    let sending = tokio::spawn(async move { c2.send_text("alice", "x").await });
    let _ = peer.recv_request().await;
    drop(peer);
    assert!(matches!(
        sending.await.expect("join"),
        Err(ClientError::Disconnected)
    ));
    assert!(matches!(
        next_event(&client).await,
        Event::Disconnected { .. }
    ));
    assert!(tokio::time::timeout(WAIT, client.next_event())
        .await
        .expect("stream end")
        .is_none());
    assert!(matches!(
        client.ping().await,
        Err(ClientError::Disconnected)
    ));
}

#[tokio::test]
async fn heartbeat_pings_follow_login_ok() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = tokio::join!(Client::connect(config(&url)), async {
        let mut p = next_peer(&mut peers).await;
        p.accept_login("bob", "n1", 1).await;
        p
    });
    let client = client.expect("connect");
    let started = std::time::Instant::now();
    let f = peer.recv().await.expect("ping");
    assert!(matches!(f.body, Some(Body::Ping(_))), "{f:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    // A user ping is answered through req_id correlation (answer every ping seen).
    let c = Arc::new(client);
    let c2 = c.clone();
    let mut pinging = tokio::spawn(async move { c2.ping().await });
    loop {
        let f = peer.recv().await.expect("frame");
        if let Some(Body::Ping(p)) = f.body {
            let pong = proto::Pong {
                client_time: p.client_time,
                server_time: 2,
            };
            peer.send(proto::frame(f.req_id, Body::Pong(pong))).await;
        }
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), &mut pinging).await {
            assert_eq!(r.expect("join").expect("pong").server_time, 2);
            break;
        }
    }
}

#[tokio::test]
async fn own_messages_are_not_emitted_and_server_cursors_fast_forward() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let client = Arc::new(client);
    let conv = "u:alice:bob";

    // Our own message (seq 5 of an old conversation) is known from its ack.
    let c2 = client.clone();
    let sending = tokio::spawn(async move { c2.send_text("alice", "mine").await });
    let f = peer.recv_request().await;
    let ack = proto::SendAck {
        conversation_id: conv.into(),
        seq: 5,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SendAck(ack))).await;
    sending.await.expect("join").expect("ack");

    // A live reply with seq 6 leaves 1..4 unknown: held, and a background sync runs.
    peer.send(deliver(vec![msg(conv, 6), msg("g:x", 10)])).await;
    let f = peer.recv_request().await;
    assert!(matches!(f.body, Some(Body::Sync(_))), "{f:?}");
    // The server's cursor is 4 for the direct chat (page starts at 5, our own message),
    // and past 10 for the group (absent from the single complete page).
    let page = proto::SyncResponse {
        messages: vec![msg(conv, 5), msg(conv, 6)],
        more: false,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SyncResp(page)))
        .await;
    // The held messages follow the sync, each conversation in seq order.
    assert_eq!(seq_of(&next_event(&client).await), 6);
    assert_eq!(seq_of(&next_event(&client).await), 10);

    let mut acks = BTreeMap::new();
    while acks.get(conv) != Some(&6) || acks.get("g:x") != Some(&10) {
        let f = peer.recv().await.expect("ack");
        if let Some(Body::DeliverAck(a)) = f.body {
            acks.insert(a.conversation_id, a.seq);
        }
    }
    assert!(client.try_next_event().is_none());
}

/// The server's view of one user, answering the way im-server does: committed messages
/// per conversation, the user's stored cursors (moved forward by its `DeliverAck`s), and
/// `SyncRequest`s read after the request's cursor where it names one, else after the
/// stored cursor, in conversation order, `more` when the limit cuts a page.
#[derive(Default)]
struct FakeStore {
    messages: BTreeMap<String, Vec<ChatMessage>>,
    stored: HashMap<String, u64>,
}

impl FakeStore {
    /// Commits `conv` up to seq `upto`.
    fn commit(&mut self, conv: &str, upto: u64) {
        let list = self.messages.entry(conv.to_owned()).or_default();
        for seq in list.len() as u64 + 1..=upto {
            list.push(msg(conv, seq));
        }
    }

    fn stored(&self, conv: &str) -> u64 {
        self.stored.get(conv).copied().unwrap_or(0)
    }

    fn ack(&mut self, a: &proto::DeliverAck) {
        let s = self.stored.entry(a.conversation_id.clone()).or_insert(0);
        *s = (*s).max(a.seq);
    }

    fn answer(&self, req: &proto::SyncRequest) -> proto::SyncResponse {
        let given: HashMap<&str, u64> = req
            .cursors
            .iter()
            .map(|c| (c.conversation_id.as_str(), c.after_seq))
            .collect();
        let limit = req.limit as usize;
        let mut messages = Vec::new();
        for (conv, list) in &self.messages {
            let after = given
                .get(conv.as_str())
                .copied()
                .unwrap_or_else(|| self.stored(conv));
            for m in list.iter().filter(|m| m.seq > after) {
                if messages.len() == limit {
                    return proto::SyncResponse {
                        messages,
                        more: true,
                        ..Default::default()
                    };
                }
                messages.push(m.clone());
            }
        }
        proto::SyncResponse {
            messages,
            more: false,
            ..Default::default()
        }
    }

    /// Reads the client's frames for `wait`: DeliverAcks move the stored cursors, pings
    /// are ignored, SyncRequests are returned (req_id, request) for the test to answer.
    async fn pump(&mut self, peer: &mut Peer, wait: Duration) -> Vec<(u64, proto::SyncRequest)> {
        let end = tokio::time::Instant::now() + wait;
        let mut syncs = Vec::new();
        loop {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return syncs;
            }
            let Some(f) = peer.try_recv(left).await else {
                return syncs;
            };
            match f.body {
                Some(Body::DeliverAck(a)) => self.ack(&a),
                Some(Body::Sync(req)) => syncs.push((f.req_id, req)),
                Some(Body::Ping(_)) => {}
                other => panic!("unexpected frame {other:?}"),
            }
        }
    }

    /// Pumps until the client sends a SyncRequest.
    async fn next_sync(&mut self, peer: &mut Peer) -> (u64, proto::SyncRequest) {
        let end = tokio::time::Instant::now() + WAIT;
        loop {
            let mut syncs = self.pump(peer, Duration::from_millis(20)).await;
            if !syncs.is_empty() {
                assert_eq!(syncs.len(), 1, "one sync at a time: {syncs:?}");
                return syncs.remove(0);
            }
            assert!(tokio::time::Instant::now() < end, "no SyncRequest in time");
        }
    }

    /// Answers a SyncRequest (and the pages after it) from the store.
    async fn serve_sync(&mut self, peer: &mut Peer, (mut id, mut req): (u64, proto::SyncRequest)) {
        loop {
            let page = self.answer(&req);
            let more = page.more;
            peer.send(proto::frame(id, Body::SyncResp(page))).await;
            if !more {
                return;
            }
            (id, req) = self.next_sync(peer).await;
        }
    }
}

/// The seqs of every message event ready now.
fn drain_seqs(c: &Client) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(e) = c.try_next_event() {
        out.push(seq_of(&e));
    }
    out
}

/// Asserts `got` is exactly 1..=n, and that the user's stored cursor (moved only by the
/// client's DeliverAcks, sent after the messages were handed to the app) is not past it.
fn assert_in_order_and_acked_within(got: &[u64], store: &FakeStore, conv: &str) {
    let want: Vec<u64> = (1..=got.len() as u64).collect();
    assert_eq!(got, want, "the app must see {conv} in seq order");
    assert!(
        store.stored(conv) <= got.len() as u64,
        "DeliverAck {} is past what the app has: {got:?}",
        store.stored(conv)
    );
}

/// Cross-node reorder: seq 3 is pushed (from node B) before seq 2 (from node A, slower
/// path). Seq 3 is held until 2 arrives; then 2 and 3 go out together, and seq 4, pushed
/// next, never overtakes 3. DeliverAcks never run ahead of what the app has, even while
/// the gap-fill sync is still unanswered.
#[tokio::test]
async fn a_held_message_is_never_overtaken_and_acks_follow_the_app() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let conv = "g:crew";
    let mut store = FakeStore::default();
    store.commit(conv, 5);
    let mut got = Vec::new();

    peer.send(deliver(vec![msg(conv, 1)])).await;
    peer.send(deliver(vec![msg(conv, 3)])).await;
    let sync = store.next_sync(&mut peer).await;
    peer.send(deliver(vec![msg(conv, 2)])).await;
    peer.send(deliver(vec![msg(conv, 4)])).await;
    // Let the acks go out (they trail by 50 ms) while the sync is still unanswered.
    assert!(store
        .pump(&mut peer, Duration::from_millis(300))
        .await
        .is_empty());
    got.extend(drain_seqs(&client));
    assert_in_order_and_acked_within(&got, &store, conv);
    assert_eq!(got, vec![1, 2, 3, 4]);
    assert_eq!(store.stored(conv), 4);

    // The sync is answered late (from the SDK's cursor: all duplicates but 5), and the
    // live push of 5 follows: a duplicate.
    store.serve_sync(&mut peer, sync).await;
    peer.send(deliver(vec![msg(conv, 5)])).await;
    for (id, req) in store.pump(&mut peer, Duration::from_millis(300)).await {
        store.serve_sync(&mut peer, (id, req)).await;
    }
    got.extend(drain_seqs(&client));
    assert_in_order_and_acked_within(&got, &store, conv);
    assert_eq!(got.len(), 5);
    assert_eq!(store.stored(conv), 5);
}

/// Seq 3 is pushed before seq 2, and the server's stored cursor for the user is already
/// past 2 (another device acked up to 3): a sync from the stored cursor returns nothing
/// at or below 3. The SDK fills its gap from its own cursor (1) instead of skipping ahead,
/// so the app gets 2, 3, 4 in order, and the late live push of 2 is a duplicate.
#[tokio::test]
async fn a_gap_is_filled_from_the_sdks_own_cursor_not_the_stored_one() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let conv = "u:alice:bob";
    let mut store = FakeStore::default();
    store.commit(conv, 4);

    peer.send(deliver(vec![msg(conv, 1)])).await;
    assert_eq!(seq_of(&next_event(&client).await), 1);
    store.stored.insert(conv.into(), 3);
    peer.send(deliver(vec![msg(conv, 3)])).await;
    let sync = store.next_sync(&mut peer).await;
    store.serve_sync(&mut peer, sync).await;
    peer.send(deliver(vec![msg(conv, 2)])).await;
    let mut got = vec![1];
    for _ in 0..3 {
        for (id, req) in store.pump(&mut peer, Duration::from_millis(200)).await {
            store.serve_sync(&mut peer, (id, req)).await;
        }
        got.extend(drain_seqs(&client));
    }
    assert_eq!(got, vec![1, 2, 3, 4], "in order, each once");
    assert_eq!(store.stored(conv), 4);
}

/// A gap-fill sync names a group the user has left meanwhile: the server refuses it
/// with NOT_MEMBER. That hole cannot be filled any more, so the held messages are
/// released in order and the sync goes on without the group's cursor.
#[tokio::test]
async fn a_hole_in_a_group_left_meanwhile_is_given_up_in_order() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let conv = "g:gone";
    peer.send(deliver(vec![msg(conv, 1), msg(conv, 4), msg(conv, 3)]))
        .await;
    assert_eq!(seq_of(&next_event(&client).await), 1);
    let f = peer.recv_request().await;
    let Some(Body::Sync(req)) = f.body else {
        panic!("expected SyncRequest, got {f:?}")
    };
    assert_eq!(cursors_of(&req), vec![(conv.to_owned(), 1)]);
    peer.send(proto::error_frame(
        f.req_id,
        ErrorCode::NotMember,
        format!("not a member of {conv}"),
    ))
    .await;
    assert_eq!(seq_of(&next_event(&client).await), 3);
    assert_eq!(seq_of(&next_event(&client).await), 4);
    let f = peer.recv_request().await;
    let Some(Body::Sync(req)) = f.body else {
        panic!("expected the sync again, got {f:?}")
    };
    assert!(req.cursors.is_empty(), "{req:?}");
    let empty = proto::SyncResponse::default();
    peer.send(proto::frame(f.req_id, Body::SyncResp(empty)))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(client.try_next_event().is_none());
}

/// Our own message lands above a hole (others' earlier messages are still in flight and
/// never come): housekeeping starts a sync from the SDK's cursor, which fills the hole.
#[tokio::test]
async fn a_hole_below_our_own_message_is_filled_by_a_housekeeping_sync() {
    let (url, mut peers) = fake_server().await;
    let (client, mut peer) = connect(&url, config(&url), &mut peers).await;
    let client = Arc::new(client);
    let conv = "u:alice:bob";
    let mut store = FakeStore::default();
    store.commit(conv, 3);
    peer.send(deliver(vec![msg(conv, 1)])).await;
    assert_eq!(seq_of(&next_event(&client).await), 1);

    let c2 = client.clone();
    let sending = tokio::spawn(async move { c2.send_text("alice", "mine").await });
    let f = peer.recv_request().await;
    let ack = proto::SendAck {
        conversation_id: conv.into(),
        seq: 3,
        ..Default::default()
    };
    peer.send(proto::frame(f.req_id, Body::SendAck(ack))).await;
    sending.await.expect("join").expect("ack");
    let started = std::time::Instant::now();
    let sync = store.next_sync(&mut peer).await;
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(cursors_of(&sync.1), vec![(conv.to_owned(), 1)]);
    store.serve_sync(&mut peer, sync).await;
    assert_eq!(seq_of(&next_event(&client).await), 2);
    store.pump(&mut peer, Duration::from_millis(200)).await;
    assert_eq!(store.stored(conv), 3, "acked past our own message");
    assert!(client.try_next_event().is_none(), "ours is not emitted");
}
