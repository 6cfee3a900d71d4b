//! The per-connection state machine (`gateway::protocol`) driven without a socket,
//! against a real pipeline on a temp SQLite store: the rules the fuzzer (`fuzz/`) checks,
//! as plain tests, and the home of regression tests for what it finds.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use im_proto::{frame, Batch, Body, ErrorCode, Frame, Login, Message as _, Ping};
use im_server::auth::TokenKeys;
use im_server::config::Config;
use im_server::flow::{CloseReason, Outbound, OutboundRx};
use im_server::gateway::protocol::{Input, Protocol, Step};
use im_server::gateway::{Connections, Gateway};
use im_server::obs::Metrics;
use im_server::pipeline::Pipeline;

const SECRET: &[u8] = b"protocol-test-secret";

struct Conn {
    p: Protocol,
    out: Arc<Outbound>,
    rx: OutboundRx,
    keys: TokenKeys,
    gw: Arc<Gateway>,
    _dir: tempfile::TempDir,
}

async fn conn(tune: impl FnOnce(&mut Config)) -> Conn {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        store: im_server::config::StoreConfig {
            sqlite_synchronous: "normal".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    tune(&mut config);
    config.validate().expect("test config validates");
    let metrics = Metrics::new(true);
    let store = im_server::store::open(&config).await.expect("store");
    let pipeline = Pipeline::spawn(store, &config, metrics.clone());
    let keys = TokenKeys::new(SECRET);
    let gw = Gateway::new(
        pipeline,
        keys.clone(),
        config.limits.clone(),
        config.flow.clone(),
        "test-node".into(),
        Arc::new(Connections::default()),
        metrics.clone(),
        Arc::new(AtomicBool::new(false)),
    );
    let (out, rx) = Outbound::new(
        1,
        "test".into(),
        config.flow.soft_mark_bytes,
        config.flow.hard_mark_bytes,
        metrics,
    );
    Conn {
        p: Protocol::new(gw.clone(), out.clone()),
        out,
        rx,
        keys,
        gw,
        _dir: dir,
    }
}

impl Conn {
    async fn send(&mut self, f: &Frame) -> Step {
        self.p.on_message(Input::Binary(im_proto::encode(f))).await
    }

    fn frames(&mut self) -> Vec<Frame> {
        let mut v = Vec::new();
        while let Ok(f) = self.rx.frames.try_recv() {
            self.out.written(f.bytes.len());
            v.push(Frame::decode(f.bytes.as_ref()).expect("server frames decode"));
        }
        v
    }

    async fn login(&mut self, user: &str) {
        let token = self
            .keys
            .issue(user, Duration::from_secs(3600))
            .expect("token");
        let step = self
            .send(&frame(
                1,
                Body::Login(Login {
                    token,
                    device_id: "d".into(),
                    resume: false,
                }),
            ))
            .await;
        assert_eq!(step, Step::Continue);
        assert!(matches!(
            self.frames().as_slice(),
            [Frame {
                body: Some(Body::LoginOk(_)),
                ..
            }]
        ));
        assert_eq!(self.p.user(), Some(user));
    }
}

fn error_codes(frames: &[Frame]) -> Vec<i32> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Error(e)) => Some(e.code),
            _ => None,
        })
        .collect()
}

fn ping(req_id: u64) -> Frame {
    frame(req_id, Body::Ping(Ping { client_time: 1 }))
}

#[tokio::test]
async fn anything_but_login_first_is_refused_and_closes() {
    let mut c = conn(|_| {}).await;
    let step = c.send(&ping(3)).await;
    assert_eq!(
        step,
        Step::Close(CloseReason::new(CloseReason::POLICY, "login required"))
    );
    let frames = c.frames();
    assert_eq!(
        error_codes(&frames),
        vec![ErrorCode::Unauthenticated as i32]
    );
    assert_eq!(frames[0].req_id, 3);
    assert_eq!(c.p.user(), None);
}

#[tokio::test]
async fn timeouts_depend_on_the_login_state() {
    let mut c = conn(|c| {
        c.limits.login_timeout_secs = 2;
        c.limits.idle_timeout_secs = 60;
    })
    .await;
    assert_eq!(c.p.timeout(), Duration::from_secs(2));
    assert_eq!(
        c.p.on_timeout(),
        CloseReason::new(CloseReason::POLICY, "login timeout")
    );
    assert_eq!(
        error_codes(&c.frames()),
        vec![ErrorCode::Unauthenticated as i32]
    );
    let mut c = conn(|c| c.limits.idle_timeout_secs = 60).await;
    c.login("idler").await;
    assert_eq!(c.p.timeout(), Duration::from_secs(60));
    assert_eq!(c.p.on_timeout().code, CloseReason::IDLE);
    assert!(c.frames().is_empty(), "an idle close sends no error");
}

#[tokio::test]
async fn socket_level_inputs_map_to_their_closes() {
    let mut c = conn(|_| {}).await;
    assert_eq!(c.p.on_message(Input::Control).await, Step::Continue);
    assert!(c.frames().is_empty());
    let step = c.p.on_message(Input::Oversized("too big".into())).await;
    assert_eq!(
        step,
        Step::Close(CloseReason::new(CloseReason::TOO_BIG, "frame too large"))
    );
    assert_eq!(error_codes(&c.frames()), vec![ErrorCode::TooLarge as i32]);
    let mut c = conn(|_| {}).await;
    c.login("texter").await;
    let step = c.p.on_message(Input::Text).await;
    assert!(matches!(step, Step::Close(r) if r.code == CloseReason::UNSUPPORTED));
    assert_eq!(error_codes(&c.frames()), vec![ErrorCode::BadFrame as i32]);
}

#[tokio::test]
async fn bad_frames_are_tolerated_up_to_the_limit() {
    let mut c = conn(|c| c.limits.max_bad_frames = 2).await;
    c.login("noisy").await;
    for _ in 0..2 {
        let step =
            c.p.on_message(Input::Binary(Bytes::from_static(&[0xff; 4])))
                .await;
        assert_eq!(step, Step::Continue);
    }
    // The third, inside a batch as a protocol error (a nested batch), closes.
    let nested = frame(
        9,
        Body::Batch(Batch {
            frames: vec![frame(10, Body::Batch(Batch::default())), ping(11)],
        }),
    );
    let step = c.send(&nested).await;
    assert_eq!(
        step,
        Step::Close(CloseReason::new(CloseReason::POLICY, "too many bad frames"))
    );
    let frames = c.frames();
    assert_eq!(error_codes(&frames), vec![ErrorCode::BadFrame as i32; 3]);
    assert!(
        !frames.iter().any(|f| matches!(f.body, Some(Body::Pong(_)))),
        "nothing after the closing frame is handled: {frames:?}"
    );
}

#[tokio::test]
async fn a_ping_flood_is_refused_then_closed() {
    let mut c = conn(|c| {
        c.limits.ping_rate_per_sec = 1;
        c.limits.ping_burst = 2;
        c.limits.max_rate_limited = 3;
    })
    .await;
    c.login("pinger").await;
    // A batch of pings counts each of them.
    let batch = frame(
        0,
        Body::Batch(Batch {
            frames: (0..4).map(ping).collect(),
        }),
    );
    assert_eq!(c.send(&batch).await, Step::Continue);
    let frames = c.frames();
    let pongs = frames
        .iter()
        .filter(|f| matches!(f.body, Some(Body::Pong(_))))
        .count();
    assert_eq!(pongs, 2);
    assert_eq!(error_codes(&frames), vec![ErrorCode::RateLimited as i32; 2]);
    assert_eq!(c.send(&ping(5)).await, Step::Continue);
    assert_eq!(
        c.send(&ping(6)).await,
        Step::Close(CloseReason::new(CloseReason::POLICY, "ping flood"))
    );
    assert_eq!(
        error_codes(&c.frames()),
        vec![ErrorCode::RateLimited as i32; 2]
    );
    // Leaving unregisters the session.
    assert_eq!(c.gw.pipeline.router.online("pinger"), 1);
    c.p.end();
    assert_eq!(c.gw.pipeline.router.online("pinger"), 0);
}

#[tokio::test]
async fn with_max_rate_limited_zero_refusals_never_close() {
    let mut c = conn(|c| {
        c.limits.ping_rate_per_sec = 1;
        c.limits.ping_burst = 1;
        c.limits.max_rate_limited = 0;
    })
    .await;
    c.login("patient").await;
    for i in 0..50 {
        assert_eq!(c.send(&ping(i)).await, Step::Continue);
    }
    let refused = error_codes(&c.frames()).len();
    assert!(refused >= 48, "{refused} refused");
}
