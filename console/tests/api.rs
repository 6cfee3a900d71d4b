//! The admin client against a mock node: recorded answers decode, and every bad or slow
//! answer becomes an `ApiError` (never a panic, never a hang past the timeout).

mod common;

use std::time::{Duration, Instant};

use common::{MockNode, Reply};
use im_console::api::{AdminClient, ApiError};

const TIMEOUT: Duration = Duration::from_millis(500);

async fn node() -> (MockNode, AdminClient) {
    let n = MockNode::start().await;
    let c = AdminClient::new(&n.url, Some("tok".into()), TIMEOUT).expect("client");
    (n, c)
}

#[tokio::test]
async fn recorded_answers_decode() {
    let (n, c) = node().await;
    n.recorded_reads();
    n.fixture("GET", "/admin/v1/profile/cpu", 200, "profile_bundle.json");
    let o = c.overview().await.expect("overview");
    assert_eq!(o.node_id, "node-a");
    assert_eq!(o.stages.len(), 11);
    assert!(o.memory.is_some());
    assert!(c.connections("queued", 10).await.expect("conns").total > 0);
    assert_eq!(c.slow_consumers().await.expect("slow").total, 1);
    assert!(c.memory().await.expect("memory").allocated > 0);
    assert_eq!(c.log_filters().await.expect("filters").filters.len(), 2);
    assert_eq!(c.logs().await.expect("logs").files.len(), 1);
    let p = c.profile(2, 49).await.expect("profile");
    assert!(p.svg.starts_with("<?xml") || p.svg.contains("<svg"));
    assert!(!p.top.is_empty());

    let seen = n.seen.lock().unwrap().clone();
    assert!(seen
        .iter()
        .any(|(r, _)| r == "GET /admin/v1/connections?sort=queued&limit=10"));
    assert!(seen
        .iter()
        .any(|(r, _)| r == "GET /admin/v1/profile/cpu?seconds=2&frequency=49&format=bundle"));
}

#[tokio::test]
async fn writes_send_the_documented_bodies() {
    let (n, c) = node().await;
    n.reply(
        "PUT",
        "/admin/v1/log-filters/user%20one",
        Reply::json(
            200,
            r#"{"uid":"user one","level":"debug","ttl_secs":600,"remaining_secs":600.0}"#,
        ),
    );
    n.reply(
        "DELETE",
        "/admin/v1/connections/7",
        Reply::json(200, r#"{"kicked":7}"#),
    );
    n.fixture(
        "DELETE",
        "/admin/v1/connections/8",
        404,
        "error_no_connection.json",
    );
    c.set_log_filter("user one", "debug", 600)
        .await
        .expect("set filter");
    assert_eq!(c.kick(7).await.expect("kick").kicked, 7);
    let e = c.kick(8).await.unwrap_err();
    assert_eq!(
        e,
        ApiError::Status {
            status: 404,
            message: "no connection 999999".into()
        }
    );
    let seen = n.seen.lock().unwrap().clone();
    let put = seen
        .iter()
        .find(|(r, _)| r.starts_with("PUT"))
        .expect("put seen");
    let body: serde_json::Value = serde_json::from_str(&put.1).expect("json body");
    assert_eq!(body, serde_json::json!({"level": "debug", "ttl_secs": 600}));
}

#[tokio::test]
async fn error_answers_are_typed() {
    let (n, c) = node().await;
    n.fixture("GET", "/admin/v1/overview", 401, "error_unauthorized.json");
    n.fixture(
        "GET",
        "/admin/v1/profile/cpu",
        409,
        "error_profile_busy.json",
    );
    // log-filters is not configured on the mock: it answers like a node without the route.
    let e = c.overview().await.unwrap_err();
    assert_eq!(e.status(), Some(401));
    assert!(
        e.to_string().contains("missing or invalid admin token"),
        "{e}"
    );
    let e = c.log_filters().await.unwrap_err();
    assert!(e.is_route_missing(), "{e:?}");
    let e = c.profile(1, 99).await.unwrap_err();
    assert_eq!(e.status(), Some(409));
}

#[tokio::test]
async fn bad_answers_never_panic() {
    let (n, c) = node().await;
    n.reply("GET", "/admin/v1/overview", Reply::json(200, "not json"));
    n.reply(
        "GET",
        "/admin/v1/memory",
        Reply::json(200, r#"{"allocated":"lots"}"#),
    );
    n.reply(
        "GET",
        "/admin/v1/logs",
        Reply::json(500, "<html>oops</html>"),
    );
    let mut hang = Reply::json(200, "{}");
    hang.hang_up = true;
    n.reply("GET", "/admin/v1/slow-consumers", hang);
    let mut short = Reply::json(200, r#"{"total":1}"#);
    short.content_length = Some(1000);
    n.reply("GET", "/admin/v1/log-filters", short);

    assert!(matches!(c.overview().await, Err(ApiError::Decode { .. })));
    match c.memory().await {
        Err(ApiError::Decode { reason, .. }) => assert!(reason.contains("allocated"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.logs().await.unwrap_err(),
        ApiError::Status {
            status: 500,
            message: "<html>oops</html>".into()
        }
    );
    assert!(c.slow_consumers().await.unwrap_err().is_unreachable());
    let t = Instant::now();
    let e = c.log_filters().await.unwrap_err();
    assert!(t.elapsed() < TIMEOUT * 4, "{e:?}");
}

#[tokio::test]
async fn slow_and_gone_nodes_time_out() {
    let (n, c) = node().await;
    let mut slow = Reply::json(200, "{}");
    slow.delay = Duration::from_secs(30);
    n.reply("GET", "/admin/v1/overview", slow);
    let t = Instant::now();
    assert_eq!(c.overview().await.unwrap_err(), ApiError::Timeout(TIMEOUT));
    assert!(t.elapsed() < TIMEOUT * 4);

    // A port nobody listens on: refused at once.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let c = AdminClient::new(&format!("http://{dead}"), None, TIMEOUT).expect("client");
    let e = c.overview().await.unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
    assert!(e.to_string().contains("cannot connect"), "{e}");
}
