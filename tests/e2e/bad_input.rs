//! Bad input: each gets its error code (and a close where the connection cannot go on),
//! is counted in `im_bad_frames_total{reason}`, and leaves other connections alone.

use im_client::proto::{frame, Body, ErrorCode, Frame, Ping};
use im_client::RawConn;

use crate::support::*;

fn error_code(f: &Frame) -> i32 {
    match &f.body {
        Some(Body::Error(e)) => e.code,
        other => panic!("expected Error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_input_gets_its_error_and_others_are_unaffected() {
    let server = TestServer::start();
    // A healthy bystander on the same node throughout.
    let mut bystander = server.raw("bystander").await;

    // Text frame: BAD_FRAME, then close 1003.
    let mut c = server.raw("t1").await;
    c.send_text("hello".into()).await.unwrap();
    let (code, reason, frames) = until_closed(&mut c).await;
    assert_eq!(error_code(&frames[0]), ErrorCode::BadFrame as i32);
    assert_eq!(code, Some(1003), "{reason}");

    // Undecodable bytes: BAD_FRAME, connection goes on.
    let mut c = server.raw("t2").await;
    c.send_bytes(vec![0xff, 0xff, 0xff, 0xff, 0x0f])
        .await
        .unwrap();
    assert_eq!(
        error_code(&next_frame(&mut c).await),
        ErrorCode::BadFrame as i32
    );
    ping_ok(&mut c, 5).await;

    // Oversized frame (over the 64 KiB default): TOO_LARGE, then close 1009.
    let mut c = server.raw("t3").await;
    c.send(&send_to_user(3, "x", &vec![b'a'; 70 * 1024], "big"))
        .await
        .unwrap();
    let (code, _, frames) = until_closed(&mut c).await;
    assert_eq!(error_code(&frames[0]), ErrorCode::TooLarge as i32);
    assert_eq!(code, Some(1009));

    // Far over the limit (beyond what the socket layer buffers): still a clean refusal.
    let mut c = server.raw("t3b").await;
    let _ = c.send_bytes(vec![0u8; 1 << 20]).await;
    let (code, _, _) = until_closed(&mut c).await;
    assert_eq!(code, Some(1009));

    // A frame before Login: UNAUTHENTICATED, then close 1008.
    let mut c = server.raw_anonymous().await;
    c.send(&send_to_user(1, "x", b"sneaky", "s")).await.unwrap();
    let (code, _, frames) = until_closed(&mut c).await;
    assert_eq!(error_code(&frames[0]), ErrorCode::Unauthenticated as i32);
    assert_eq!(code, Some(1008));

    // A bad token: UNAUTHENTICATED, then close 1008.
    let mut c = server.raw_anonymous().await;
    c.send(&login_frame("not-a-jwt")).await.unwrap();
    let (code, _, frames) = until_closed(&mut c).await;
    assert_eq!(error_code(&frames[0]), ErrorCode::Unauthenticated as i32);
    assert_eq!(code, Some(1008));

    // A token signed with another secret.
    let forged = im_server::auth::TokenKeys::new(b"wrong")
        .issue("mallory", std::time::Duration::from_secs(60))
        .unwrap();
    let mut c = server.raw_anonymous().await;
    c.send(&login_frame(&forged)).await.unwrap();
    let (code, _, frames) = until_closed(&mut c).await;
    assert_eq!(error_code(&frames[0]), ErrorCode::Unauthenticated as i32);
    assert_eq!(code, Some(1008));

    // Send to a group one is not in: NOT_MEMBER, connection goes on; unknown group: NOT_FOUND.
    let mut owner = server.raw("owner").await;
    create_group(&mut owner, "private", vec![]).await;
    let mut c = server.raw("outsider").await;
    c.send(&send_to_group(9, "private", b"let me in", "o-1"))
        .await
        .unwrap();
    let f = next_frame(&mut c).await;
    assert_eq!(f.req_id, 9);
    assert_eq!(error_code(&f), ErrorCode::NotMember as i32);
    c.send(&send_to_group(10, "ghost", b"anyone?", "o-2"))
        .await
        .unwrap();
    assert_eq!(
        error_code(&next_frame(&mut c).await),
        ErrorCode::NotFound as i32
    );
    // Protocol misuse inside a session: Send without a target; a second Login of the
    // same user is a token refresh (LoginOk).
    c.send(&frame(11, Body::Send(Default::default())))
        .await
        .unwrap();
    assert_eq!(
        error_code(&next_frame(&mut c).await),
        ErrorCode::BadFrame as i32
    );
    c.send(&login_frame(&server.token("outsider")))
        .await
        .unwrap();
    assert!(matches!(
        next_frame(&mut c).await.body,
        Some(Body::LoginOk(_))
    ));
    ping_ok(&mut c, 12).await;

    // The bystander never noticed, and the server is still whole.
    ping_ok(&mut bystander, 99).await;
    bystander
        .send(&send_to_user(100, "owner", b"still here", "b-1"))
        .await
        .unwrap();
    assert_eq!(acks(&mut bystander, 1).await.len(), 1);

    for reason in [
        "text",
        "decode",
        "too_large",
        "unauthenticated",
        "not_member",
        "protocol",
    ] {
        let n = server.metric("im_bad_frames_total", &[("reason", reason)]);
        assert!(n >= 1.0, "im_bad_frames_total{{reason={reason}}} = {n}");
    }
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_are_closed_after_the_login_timeout() {
    let server = TestServer::start_with(&[("IM_LIMITS_LOGIN_TIMEOUT_SECS", "1")]);
    let opened = std::time::Instant::now();
    let mut c = server.raw_anonymous().await;
    let (code, reason, frames) = until_closed(&mut c).await;
    let waited = opened.elapsed();
    assert_eq!(code, Some(1008), "{reason}");
    assert_eq!(reason, "login timeout");
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(error_code(&frames[0]), ErrorCode::Unauthenticated as i32);
    assert!(
        waited >= std::time::Duration::from_millis(900)
            && waited < std::time::Duration::from_secs(5),
        "closed after {waited:?} with a 1 s login timeout"
    );
    assert_eq!(
        server.metric("im_bad_frames_total", &[("reason", "login_timeout")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_bad_frames_close_the_connection() {
    let server = TestServer::start_with(&[("IM_LIMITS_MAX_BAD_FRAMES", "3")]);
    let mut c = server.raw("noisy").await;
    for _ in 0..5 {
        let _ = c.send_bytes(vec![0xff; 8]).await;
    }
    let (code, reason, frames) = until_closed(&mut c).await;
    assert_eq!(code, Some(1008), "{reason}");
    assert_eq!(
        frames.len(),
        4,
        "one BAD_FRAME per bad frame up to the limit: {frames:?}"
    );
}

/// Sends `n` Pings without reading; returns the frames up to the close and the close.
async fn flood_pings(c: &mut RawConn, n: u64) -> (Option<u16>, String, Vec<Frame>) {
    for i in 0..n {
        if c.send(&frame(
            1000 + i,
            Body::Ping(Ping {
                client_time: i as i64,
            }),
        ))
        .await
        .is_err()
        {
            break;
        }
    }
    until_closed(c).await
}

fn rate_limited(frames: &[Frame]) -> Vec<&im_client::proto::Error> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Error(e)) if e.code == ErrorCode::RateLimited as i32 => Some(e),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_is_rate_limited_then_closed() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_PING_RATE_PER_SEC", "1"),
        ("IM_LIMITS_PING_BURST", "3"),
        ("IM_LIMITS_MAX_RATE_LIMITED", "5"),
    ]);
    let mut bystander = server.raw("calm").await;
    let mut c = server.raw("pinger").await;
    // 3 answered, 6 refused: 12 is past the close without piling up unread data.
    let (code, reason, frames) = flood_pings(&mut c, 12).await;
    assert_eq!(code, Some(1008), "{reason}: {frames:?}");
    assert_eq!(reason, "ping flood");
    let pongs = frames
        .iter()
        .filter(|f| matches!(f.body, Some(Body::Pong(_))))
        .count();
    assert!(
        (3..=4).contains(&pongs),
        "{pongs} pongs: the burst of 3 (+1 refill at most)"
    );
    let limited = rate_limited(&frames);
    assert_eq!(
        limited.len(),
        6,
        "5 refusals tolerated, the 6th closes: {frames:?}"
    );
    assert!(limited
        .iter()
        .all(|e| e.retry_after_ms > 0 && e.message.contains("ping")));
    assert_eq!(pongs + limited.len(), frames.len(), "{frames:?}");
    assert_eq!(
        server.metric("im_flood_disconnects_total", &[("frame", "ping")]),
        1.0
    );
    assert_eq!(
        server.metric("im_flood_disconnects_total", &[("frame", "send")]),
        0.0
    );
    assert_eq!(
        server.metric("im_connections_closed_total", &[("reason", "ping flood")]),
        1.0
    );
    assert!(server.metric("im_bad_frames_total", &[("reason", "rate_limited")]) >= 6.0);
    let log = server.log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("closing a flooding connection"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("ping"),
        "{}",
        warned[0]
    );
    // Pings within the limit are answered, and other connections never noticed.
    ping_ok(&mut bystander, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_flood_past_the_threshold_is_closed() {
    let server = TestServer::start_with(&[
        ("IM_LIMITS_SEND_RATE_PER_SEC", "1"),
        ("IM_LIMITS_SEND_BURST", "2"),
        ("IM_LIMITS_MAX_RATE_LIMITED", "3"),
    ]);
    let mut c = server.raw("flooder").await;
    // 2 accepted, 4 refused: 10 is past the close without piling up unread data.
    for i in 0..10u64 {
        if c.send(&send_to_user(i + 1, "victim", b"spam", &format!("f{i}")))
            .await
            .is_err()
        {
            break;
        }
    }
    let (code, reason, frames) = until_closed(&mut c).await;
    assert_eq!(code, Some(1008), "{reason}: {frames:?}");
    assert_eq!(reason, "send flood");
    let limited = rate_limited(&frames);
    assert_eq!(
        limited.len(),
        4,
        "3 refusals tolerated, the 4th closes: {frames:?}"
    );
    assert!(limited
        .iter()
        .all(|e| e.retry_after_ms > 0 && e.message.contains("send")));
    let acked = frames
        .iter()
        .filter(|f| matches!(f.body, Some(Body::SendAck(_))))
        .count();
    assert!(
        acked <= 3,
        "{acked} acks with a burst of 2 (+1 refill at most)"
    );
    assert_eq!(
        server.metric("im_flood_disconnects_total", &[("frame", "send")]),
        1.0
    );
    assert_eq!(
        server.metric("im_connections_closed_total", &[("reason", "send flood")]),
        1.0
    );
    let log = server.log();
    assert_eq!(
        log.matches("closing a flooding connection").count(),
        1,
        "{log}"
    );
    // What was accepted before the close is stored and reaches the recipient.
    let mut victim = server.raw("victim").await;
    let mut got = raw_sync_all(&mut victim, 100).await;
    for _ in 0..20 {
        if got.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        got = raw_sync_all(&mut victim, 100).await;
    }
    assert!(
        (2..=3).contains(&got.len()),
        "{} messages stored",
        got.len()
    );
    assert!(got
        .iter()
        .all(|m| m.sender == "flooder" && &m.payload[..] == b"spam"));
    // The flooder may come back (a fresh connection has a fresh budget).
    let mut again = server.raw("flooder").await;
    again
        .send(&send_to_user(100, "victim", b"sorry", "f-again"))
        .await
        .unwrap();
    assert_eq!(acks(&mut again, 1).await.len(), 1);
}
