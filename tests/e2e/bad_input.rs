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

async fn ping_ok(c: &mut RawConn, req_id: u64) {
    c.send(&frame(req_id, Body::Ping(Ping { client_time: 7 })))
        .await
        .unwrap();
    let f = next_frame(c).await;
    assert_eq!(f.req_id, req_id);
    assert!(
        matches!(f.body, Some(Body::Pong(ref p)) if p.client_time == 7),
        "{f:?}"
    );
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
    owner
        .send(&frame(
            2,
            Body::GroupOp(im_client::proto::GroupOp {
                op: 0,
                group_id: "private".into(),
                members: vec![],
            }),
        ))
        .await
        .unwrap();
    assert!(matches!(
        next_frame(&mut owner).await.body,
        Some(Body::GroupOpOk(_))
    ));
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
    // Protocol misuse inside a session: Send without a target, a second Login.
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
    assert_eq!(
        error_code(&next_frame(&mut c).await),
        ErrorCode::BadFrame as i32
    );
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
    let mut c = server.raw_anonymous().await;
    let (code, reason, frames) = until_closed(&mut c).await;
    assert_eq!(code, Some(1008), "{reason}");
    assert_eq!(error_code(&frames[0]), ErrorCode::Unauthenticated as i32);
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
