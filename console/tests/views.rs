//! Snapshot tests of every view: recorded admin API answers (tests/fixtures) are served
//! by a mock node, fetched with the console's real client, folded into the state with
//! the same update functions the app uses, and rendered into a `TestBackend`. The
//! snapshots live in tests/snapshots; a changed screen fails until reviewed
//! (`cargo insta review`, or INSTA_UPDATE=always to accept).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{fixture, MockNode};
use im_console::action::Action;
use im_console::api::{AdminClient, ApiError, ProfileBundle};
use im_console::state::{AppState, Command, ProfileKind, ProfileState, TailStatus, Update, View};
use im_console::view;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

/// The URL shown for the recorded node (the mock's port changes every run).
const URL_A: &str = "http://127.0.0.1:7071";
const URL_B: &str = "http://127.0.0.1:7072";

fn draw(state: &AppState, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| view::render(f, state)).expect("draw");
    t.backend().to_string()
}

fn at(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

/// A mock node serving every recorded answer.
async fn recorded_node() -> MockNode {
    let n = MockNode::start().await;
    let series: Vec<serde_json::Value> =
        serde_json::from_slice(&fixture("overview_series.json")).expect("series");
    for o in series {
        n.reply(
            "GET",
            "/admin/v1/overview",
            common::Reply::json(200, o.to_string()),
        );
    }
    n.recorded_reads();
    n.fixture(
        "GET",
        "/admin/v1/slow-consumers",
        200,
        "slow_consumers_2.json",
    );
    n
}

/// Polls `client` the way the app does, `polls` overview rounds one second apart.
async fn poll_into(state: &mut AppState, node: usize, client: &AdminClient, t0: Instant) {
    for i in 0..11 {
        let o = client.overview().await.map(Box::new);
        state.on_update(node, Update::Overview(o), at(t0, i));
    }
    let c = client.connections("conn_id", 2000).await;
    state.on_update(node, Update::Connections(c), at(t0, 10));
    let s1 = client.slow_consumers().await;
    state.on_update(node, Update::Slow(s1), at(t0, 9));
    let s2 = client.slow_consumers().await;
    state.on_update(node, Update::Slow(s2), at(t0, 10));
    state.on_update(node, Update::Memory(client.memory().await), at(t0, 10));
    let q = client.connections("queued", 20).await;
    state.on_update(node, Update::TopQueued(q), at(t0, 10));
    let f = client.log_filters().await;
    state.on_update(node, Update::LogFilters(f), at(t0, 10));
    state.on_update(node, Update::Logs(client.logs().await), at(t0, 10));
    state.tick(at(t0, 10));
    state.status = None;
}

/// One recorded node, fully polled.
async fn loaded() -> (AppState, MockNode, Instant) {
    let n = recorded_node().await;
    let client =
        AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).expect("client");
    let t0 = Instant::now();
    let mut state = AppState::new([URL_A.to_owned()], t0);
    poll_into(&mut state, 0, &client, t0).await;
    (state, n, t0)
}

fn go(state: &mut AppState, v: View) {
    state.apply(Action::GoView(v));
}

#[tokio::test]
async fn overview() {
    let (state, _n, _) = loaded().await;
    insta::assert_snapshot!("overview_120x40", draw(&state, 120, 40));
    insta::assert_snapshot!("overview_200x50", draw(&state, 200, 50));
}

/// The Overview of one node answering one recorded overview, `w` x `h`.
async fn overview_of(fixture_name: &str, w: u16, h: u16) -> String {
    let n = MockNode::start().await;
    n.fixture("GET", "/admin/v1/overview", 200, fixture_name);
    let client =
        AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).expect("client");
    let t0 = Instant::now();
    let mut state = AppState::new([URL_A.to_owned()], t0);
    poll_into(&mut state, 0, &client, t0).await;
    draw(&state, w, h)
}

/// In cluster mode the overview lists the nodes (n2 killed: down) under the gauges.
#[tokio::test]
async fn overview_in_a_cluster() {
    let screen = overview_of("overview_cluster.json", 120, 44).await;
    assert!(screen.contains("Cluster: 2/3 healthy"), "{screen}");
    insta::assert_snapshot!("overview_cluster_120x44", screen);
}

/// In multi-region mode the overview lists the region pairs into the node's region:
/// lag in records and seconds, applied records, the link state (a cut link in red).
#[tokio::test]
async fn overview_with_regions() {
    let screen = overview_of("overview_regions.json", 120, 50).await;
    assert!(
        screen.contains("Regions: 3 pairs, 1 links down, worst lag 1m 35s"),
        "{screen}"
    );
    for row in [
        ["eu", "us", "up", "0", "0.0s", "81234"],
        ["ap", "us", "link down", "1530", "1m 35s", "40112"],
        ["sa", "us", "?", "12", "0.4s", "977"],
    ] {
        let line = screen
            .lines()
            .find(|l| l.contains(&format!("│{} ", row[0])) && l.contains(row[5]))
            .unwrap_or_else(|| panic!("no row for {}: {screen}", row[0]));
        let cells: Vec<&str> = line.split_whitespace().collect();
        for cell in row {
            for word in cell.split(' ') {
                assert!(cells.iter().any(|c| c.contains(word)), "{cell} in {line}");
            }
        }
    }
    // The cluster table is still there above it.
    assert!(screen.contains("Cluster: 2/3 healthy"), "{screen}");
    insta::assert_snapshot!("overview_regions_120x50", screen);
}

/// A node at its caps and draining: the cap, the refusals by reason and the drain show.
#[tokio::test]
async fn overview_with_connection_caps_while_draining() {
    let screen = overview_of("overview_limits.json", 120, 40).await;
    assert!(screen.contains("of 19744"), "{screen}");
    assert!(
        screen.contains("refused       15  full 3, per ip 12"),
        "{screen}"
    );
    assert!(screen.contains("draining (shutting down)"), "{screen}");
    insta::assert_snapshot!("overview_limits_120x40", screen);
}

/// A node whose store refuses Sends (disk full): the header says so, disk limits.
#[tokio::test]
async fn overview_while_the_store_refuses_sends() {
    let screen = overview_of("overview_store_full.json", 120, 40).await;
    assert!(
        screen.contains("refusing sends: store disk_full"),
        "{screen}"
    );
    insta::assert_snapshot!("overview_store_full_120x40", screen);
}

/// A node whose before-send hook's breaker is open: the header says so and what it means.
#[tokio::test]
async fn overview_while_the_before_send_hook_is_open() {
    let screen = overview_of("overview_hook_open.json", 160, 40).await;
    assert!(
        screen.contains("before-send hook open: sends unchecked"),
        "{screen}"
    );
    assert!(!screen.contains("refusing sends"), "{screen}");
}

/// A node that reports its runtime: the panel shows the workers' busy share, the global
/// queue and each monitored task's polls, slow polls and scheduled delay.
#[tokio::test]
async fn overview_with_the_runtime_panel() {
    let screen = overview_of("overview_runtime.json", 120, 48).await;
    assert!(screen.contains("runtime: 2 workers"), "{screen}");
    assert!(screen.contains("workers busy"), "{screen}");
    for task in ["writer", "router", "receipts"] {
        assert!(screen.contains(task), "{task}: {screen}");
    }
    assert!(screen.contains("sched delay"), "{screen}");
    insta::assert_snapshot!("overview_runtime_120x48", screen);
}

#[tokio::test]
async fn connections_sorted_and_filtered() {
    let (mut state, _n, _) = loaded().await;
    go(&mut state, View::Connections);
    insta::assert_snapshot!("connections", draw(&state, 120, 30));
    for _ in 0..3 {
        state.apply(Action::Sort); // conn_id -> user -> age -> queued
    }
    state.apply(Action::StartFilter);
    for c in "r".chars() {
        state.apply(Action::Char(c));
    }
    state.apply(Action::Submit);
    state.status = None;
    insta::assert_snapshot!("connections_filter_r_by_queued", draw(&state, 120, 30));
}

#[tokio::test]
async fn kick_confirmation_and_result() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Connections);
    state.apply(Action::Down);
    state.apply(Action::Delete);
    insta::assert_snapshot!("kick_confirm", draw(&state, 120, 30));
    let cmds = state.apply(Action::Confirm);
    assert_eq!(cmds.len(), 1);
    let conn_id = match &cmds[0] {
        Command::Kick { conn_id, .. } => *conn_id,
        other => panic!("{other:?}"),
    };
    // The node answers 404 for a connection that is already gone (recorded).
    let n = MockNode::start().await;
    n.fixture(
        "DELETE",
        &format!("/admin/v1/connections/{conn_id}"),
        404,
        "error_no_connection.json",
    );
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    let result = c.kick(conn_id).await;
    state.on_update(0, Update::Kicked { conn_id, result }, at(t0, 10));
    insta::assert_snapshot!("kick_failed_status", draw(&state, 120, 30));
}

#[tokio::test]
async fn revoke_confirmation_and_result() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Connections);
    state.apply(Action::Down);
    state.apply(Action::Revoke);
    insta::assert_snapshot!("revoke_confirm", draw(&state, 120, 30));
    let cmds = state.apply(Action::Confirm);
    let user = match &cmds[..] {
        [Command::Revoke { user, .. }] => user.clone(),
        other => panic!("{other:?}"),
    };
    let result = Ok(im_console::api::Revoked {
        user: user.clone(),
        revoked_at: 1_700_000_000,
        closed: 2,
    });
    state.on_update(0, Update::Revoked { user, result }, at(t0, 10));
    insta::assert_snapshot!("revoke_done_status", draw(&state, 120, 30));
}

#[tokio::test]
async fn slow_consumers() {
    let (mut state, _n, _) = loaded().await;
    go(&mut state, View::Slow);
    insta::assert_snapshot!("slow_consumers", draw(&state, 140, 34));
}

#[tokio::test]
async fn latency() {
    let (mut state, _n, _) = loaded().await;
    go(&mut state, View::Latency);
    insta::assert_snapshot!("latency_log", draw(&state, 140, 40));
    state.apply(Action::ToggleScale);
    insta::assert_snapshot!("latency_linear", draw(&state, 140, 30));
}

#[tokio::test]
async fn memory() {
    let (mut state, _n, _) = loaded().await;
    go(&mut state, View::Memory);
    insta::assert_snapshot!("memory", draw(&state, 140, 34));
}

#[tokio::test]
async fn profile_states() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Profile);
    insta::assert_snapshot!("profile_idle", draw(&state, 120, 20));

    state.apply(Action::Add);
    insta::assert_snapshot!("profile_form", draw(&state, 120, 20));
    let cmds = state.apply(Action::Submit);
    assert_eq!(cmds.len(), 1, "defaults are valid");
    state.tick(at(t0, 14));
    insta::assert_snapshot!("profile_running", draw(&state, 120, 12));

    // A second capture elsewhere: the node answers 409 (recorded).
    let n = MockNode::start().await;
    n.fixture(
        "GET",
        "/admin/v1/profile/cpu",
        409,
        "error_profile_busy.json",
    );
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    let busy = c
        .profile(10, 99)
        .await
        .map(|_| unreachable!("the mock answers 409"));
    state.on_update(0, Update::Profile(busy), at(t0, 14));
    insta::assert_snapshot!("profile_busy_409", draw(&state, 120, 12));

    let bundle: ProfileBundle =
        serde_json::from_slice(&fixture("profile_bundle.json")).expect("bundle");
    let result = im_console::save::cpu_result(
        bundle,
        Some(PathBuf::from("./profiles/im-cpu-node-a-1796225340.svg")),
        Some(PathBuf::from("./profiles/im-cpu-node-a-1796225340.pb.gz")),
        None,
    );
    state.on_update(0, Update::Profile(Ok(result)), at(t0, 24));
    assert!(matches!(state.nodes[0].profile, ProfileState::Done(_)));
    insta::assert_snapshot!("profile_done", draw(&state, 120, 36));
}

#[tokio::test]
async fn heap_profile_states() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Profile);
    // `t` toggles the view to the heap profile; the help line names the way back.
    state.apply(Action::ToggleScale);
    assert_eq!(state.profile_kind, ProfileKind::Heap);
    insta::assert_snapshot!("heap_profile_idle", draw(&state, 120, 20));

    state.apply(Action::Add);
    insta::assert_snapshot!("heap_profile_form", draw(&state, 120, 20));
    let cmds = state.apply(Action::Submit);
    assert_eq!(cmds.len(), 1, "defaults are valid");
    // The runbook's window (30-60 s), not a capture too short to show a leak.
    assert!(
        matches!(cmds[0], Command::HeapProfile { seconds: 30, .. }),
        "{cmds:?}"
    );
    assert!(matches!(state.nodes[0].heap, ProfileState::Running { .. }));
    assert!(matches!(state.nodes[0].profile, ProfileState::Idle));
    state.tick(at(t0, 14));
    insta::assert_snapshot!("heap_profile_running", draw(&state, 120, 12));

    // The recorded bundle, fetched through the console's client from a mock node.
    let n = MockNode::start().await;
    n.fixture(
        "GET",
        "/admin/v1/profile/heap",
        200,
        "heap_profile_bundle.json",
    );
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    let bundle = c.heap_profile(5).await.expect("heap bundle");
    let seen = n.seen.lock().unwrap().clone();
    assert!(seen
        .iter()
        .any(|(r, _)| r == "GET /admin/v1/profile/heap?seconds=5&format=bundle"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut result = im_console::save::save_heap_result(dir.path(), "node-a", bundle, 1796225340);
    assert_eq!(result.save_error, None);
    assert!(result.pprof_path.as_ref().is_some_and(|p| p.exists()));
    // Shown paths independent of the temp dir.
    result.svg_path = Some(PathBuf::from("./profiles/im-heap-node-a-1796225340.svg"));
    result.pprof_path = Some(PathBuf::from("./profiles/im-heap-node-a-1796225340.pb.gz"));
    state.on_update(0, Update::HeapProfile(Ok(result)), at(t0, 24));
    assert!(matches!(state.nodes[0].heap, ProfileState::Done(_)));
    insta::assert_snapshot!("heap_profile_done", draw(&state, 120, 36));

    // Back to the CPU profile: its own (idle) state, not the heap's.
    state.apply(Action::ToggleScale);
    assert_eq!(state.profile_kind, ProfileKind::Cpu);
    assert!(state.visible_top().is_empty());

    // A node built without the profiler answers 503.
    let n = MockNode::start().await;
    n.reply(
        "GET",
        "/admin/v1/profile/heap",
        common::Reply::json(
            503,
            r#"{"error":"heap profiling is not available in this build (cargo feature heap-profiling, jemalloc opt.prof)"}"#.to_owned(),
        ),
    );
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    let r = c
        .heap_profile(1)
        .await
        .map(|_| unreachable!("the mock answers 503"));
    state.on_update(0, Update::HeapProfile(r), at(t0, 30));
    let ProfileState::Failed(text) = &state.nodes[0].heap else {
        panic!("a failed capture")
    };
    assert!(text.contains("503"), "{text}");
}

#[tokio::test]
async fn logs() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Logs);
    insta::assert_snapshot!("logs", draw(&state, 120, 30));
    state.apply(Action::Add);
    for c in "alice".chars() {
        state.apply(Action::Char(c));
    }
    insta::assert_snapshot!("logs_add_filter_form", draw(&state, 120, 30));
    state.apply(Action::Cancel);

    let n = MockNode::start().await;
    n.fixture("GET", "/admin/v1/logs", 200, "logs_rotated.json");
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    state.on_update(0, Update::Logs(c.logs().await), at(t0, 10));
    insta::assert_snapshot!("logs_rotated_files", draw(&state, 120, 30));
}

/// `f` on the selected filter opens the live tail: the recorded stream (a real node's
/// lines, read with the console's client) scrolls in the lower pane with the dropped
/// count; page up scrolls back; `f` again stops it.
#[tokio::test]
async fn logs_live_tail() {
    let (mut state, n, t0) = loaded().await;
    n.fixture("GET", "/admin/v1/logs/tail", 200, "log_tail.ndjson");
    go(&mut state, View::Logs);
    let cmds = state.apply(Action::Tail);
    let [Command::StartTail {
        node: 0,
        uid,
        generation,
    }] = cmds.as_slice()
    else {
        panic!("f opens a tail: {cmds:?}");
    };
    assert_eq!(uid, "r1", "the selected filter's user");
    let client = AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).unwrap();
    let mut tail = client.log_tail(uid, None, 200).await.expect("tail opens");
    let mut lines = Vec::new();
    while let Some(l) = tail.next_line().await.expect("a line") {
        lines.push(l);
    }
    assert!(lines.iter().any(|l| l.dropped.is_some()), "a dropped line");
    let seen = n.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|(r, _)| r == "GET /admin/v1/logs/tail?uid=r1&backlog=200"),
        "{seen:?}"
    );
    let generation = *generation;
    state.on_update(0, Update::TailLines { generation, lines }, at(t0, 11));
    state.status = None;
    insta::assert_snapshot!("logs_live_tail", draw(&state, 160, 32));
    state.apply(Action::PageUp);
    insta::assert_snapshot!("logs_live_tail_scrolled", draw(&state, 160, 32));
    state.apply(Action::Bottom);
    assert_eq!(state.tail.as_ref().map(|t| t.scroll), Some(0));
    // Lines of an earlier tail are ignored; `f` stops this one.
    state.on_update(
        0,
        Update::TailLines {
            generation: generation + 7,
            lines: vec![Default::default()],
        },
        at(t0, 12),
    );
    assert_eq!(state.apply(Action::Tail), [Command::StopTail]);
    let t = state.tail.as_ref().unwrap();
    assert_eq!((t.status.clone(), t.dropped), (TailStatus::Stopped, 12));
    state.status = None;
    insta::assert_snapshot!("logs_live_tail_stopped", draw(&state, 160, 32));
}

#[tokio::test]
async fn logs_on_a_node_without_the_routes() {
    let (mut state, _n, t0) = loaded().await;
    // A node from before the diagnosis routes: 404 {"error":"no such route"} (recorded).
    let n = MockNode::start().await;
    n.fixture(
        "GET",
        "/admin/v1/log-filters",
        404,
        "error_no_such_route.json",
    );
    n.fixture("GET", "/admin/v1/logs", 404, "error_no_such_route.json");
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    state.nodes[0].log_filters = Default::default();
    state.nodes[0].logs = Default::default();
    state.on_update(0, Update::LogFilters(c.log_filters().await), at(t0, 10));
    state.on_update(0, Update::Logs(c.logs().await), at(t0, 10));
    go(&mut state, View::Logs);
    insta::assert_snapshot!("logs_route_missing", draw(&state, 120, 20));
}

#[tokio::test]
async fn help_overlay() {
    let (mut state, _n, _) = loaded().await;
    state.apply(Action::ToggleHelp);
    insta::assert_snapshot!("help", draw(&state, 120, 44));
}

/// Node A recorded and up, node B unreachable: cluster row, picker, and B's own screen.
#[tokio::test]
async fn two_nodes_one_unreachable() {
    let n = recorded_node().await;
    let client =
        AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).expect("client");
    // A port nobody listens on, for the real "connection refused".
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let gone =
        AdminClient::new(&format!("http://{dead}"), None, Duration::from_secs(2)).expect("client");
    let t0 = Instant::now();
    let mut state = AppState::new([URL_A.to_owned(), URL_B.to_owned()], t0);
    poll_into(&mut state, 0, &client, t0).await;
    let e = gone.overview().await.map(Box::new);
    assert!(matches!(&e, Err(err) if err.is_unreachable()), "{e:?}");
    state.on_update(1, Update::Overview(e), at(t0, 2));
    state.tick(at(t0, 10));
    state.status = None;
    insta::assert_snapshot!("cluster_overview", draw(&state, 140, 42));

    state.apply(Action::NodePicker);
    insta::assert_snapshot!("node_picker", draw(&state, 140, 20));
    state.apply(Action::Down);
    state.apply(Action::Submit);
    state.status = None;
    insta::assert_snapshot!("unreachable_node", draw(&state, 120, 20));
}

/// A node that was up, then went away: stale data under a red banner; then it comes back.
#[tokio::test]
async fn node_goes_away_and_comes_back() {
    let (mut state, _n, t0) = loaded().await;
    let err = ApiError::Timeout(Duration::from_secs(2));
    state.on_update(0, Update::Overview(Err(err)), at(t0, 12));
    state.tick(at(t0, 20));
    insta::assert_snapshot!("stale_after_timeout", draw(&state, 120, 24));

    let n = MockNode::start().await;
    n.fixture("GET", "/admin/v1/overview", 200, "overview.json");
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    state.on_update(
        0,
        Update::Overview(c.overview().await.map(Box::new)),
        at(t0, 21),
    );
    let status = state
        .status
        .as_ref()
        .map(|s| s.text.clone())
        .unwrap_or_default();
    assert!(status.contains("node-a is back"), "{status}");
    assert!(!draw(&state, 120, 24).contains("unreachable"));
}

/// Wrong token: the node answers 401 (recorded); the console says so and what to check.
#[tokio::test]
async fn unauthorized_node() {
    let n = MockNode::start().await;
    n.fixture("GET", "/admin/v1/overview", 401, "error_unauthorized.json");
    let c = AdminClient::new(&n.url, Some("wrong".into()), Duration::from_secs(5)).expect("client");
    let t0 = Instant::now();
    let mut state = AppState::new([URL_A.to_owned()], t0);
    state.on_update(0, Update::Overview(c.overview().await.map(Box::new)), t0);
    insta::assert_snapshot!("unauthorized", draw(&state, 120, 20));
}

/// `M`: the announcement form (group id, text), its validation, and the status line after
/// the node answers (a recorded 200, then a recorded 404 for an unknown group); the
/// request the console sends is a SYSTEM message to the group with an Idempotency-Key.
#[tokio::test]
async fn announce_to_a_group() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Connections);
    state.apply(Action::Announce);
    assert!(state.apply(Action::Submit).is_empty(), "empty group id");
    for c in "ops".chars() {
        state.apply(Action::Char(c));
    }
    state.apply(Action::NextField);
    for c in "maintenance at 22:00 UTC".chars() {
        state.apply(Action::Char(c));
    }
    insta::assert_snapshot!("announce_form", draw(&state, 120, 30));
    let cmds = state.apply(Action::Submit);
    let (group_id, text) = match &cmds[..] {
        [Command::Announce { group_id, text, .. }] => (group_id.clone(), text.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (group_id.as_str(), text.as_str()),
        ("ops", "maintenance at 22:00 UTC")
    );

    let n = MockNode::start().await;
    n.fixture("POST", "/admin/v1/messages", 200, "posted_messages.json");
    n.fixture("POST", "/admin/v1/messages", 404, "error_no_group.json");
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    let body = im_console::api::PostMessage {
        group_id: Some(group_id.clone()),
        kind: im_console::api::MessageKind::System,
        payload: Some(text),
        ..Default::default()
    };
    let result = c.post_message(&body, Some("k-1")).await;
    state.on_update(
        0,
        Update::Announced {
            group_id: group_id.clone(),
            result,
        },
        at(t0, 10),
    );
    insta::assert_snapshot!("announce_done_status", draw(&state, 120, 30));
    let sent = n
        .seen
        .lock()
        .expect("seen")
        .last()
        .cloned()
        .expect("a request");
    let sent: serde_json::Value = serde_json::from_str(&sent.1).expect("a JSON body");
    assert_eq!(
        sent,
        serde_json::json!({"group_id": "ops", "kind": "system", "payload": "maintenance at 22:00 UTC"})
    );
    let result = c.post_message(&body, Some("k-2")).await;
    state.on_update(0, Update::Announced { group_id, result }, at(t0, 11));
    let status = state
        .status
        .as_ref()
        .map(|s| s.text.clone())
        .unwrap_or_default();
    assert_eq!(
        status, "announce to ops failed: HTTP 404: no group ops",
        "{status}"
    );
}

/// The Users view: before any search, a user found in a two-node cluster (kick of a
/// session on a watched node asks first; one on an unwatched node says so), a user
/// nothing is known of (404) and an answer with a node missing.
#[tokio::test]
async fn users_view() {
    let (mut state, n, t0) = loaded().await;
    go(&mut state, View::Users);
    insta::assert_snapshot!("users_empty", draw(&state, 120, 40));
    assert_eq!(state.plan(0).user, None);

    state.apply(Action::StartFilter);
    for c in "bob".chars() {
        state.apply(Action::Char(c));
    }
    insta::assert_snapshot!("users_typing", draw(&state, 120, 12));
    state.apply(Action::Submit);
    assert_eq!(state.plan(0).user.as_deref(), Some("bob"));

    n.fixture("GET", "/admin/v1/users/bob", 200, "user.json");
    n.fixture("GET", "/admin/v1/users/zed", 404, "error_no_user.json");
    let client =
        AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).expect("client");
    let result = client.user("bob", 50, 20).await;
    state.on_update(
        0,
        Update::User {
            uid: "bob".into(),
            result,
        },
        at(t0, 10),
    );
    state.status = None;
    let screen = draw(&state, 120, 40);
    assert!(screen.contains("sessions · 3"), "{screen}");
    assert!(screen.contains("45"), "{screen}");
    insta::assert_snapshot!("users_found", screen);
    assert!(n
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|(r, _)| r.contains("/admin/v1/users/bob?backlog=50&messages=20")));

    // x on the first session (node-a, this node): the kick confirmation.
    state.apply(Action::Delete);
    insta::assert_snapshot!("users_kick_confirm", draw(&state, 120, 40));
    let cmds = state.apply(Action::Confirm);
    assert!(
        matches!(
            &cmds[..],
            [Command::Kick {
                node: 0,
                conn_id: 17
            }]
        ),
        "{cmds:?}"
    );
    // The third session is on node-b, which this console does not watch.
    state.apply(Action::Down);
    state.apply(Action::Down);
    assert!(state.apply(Action::Delete).is_empty());
    let text = state
        .status
        .as_ref()
        .map(|s| s.text.clone())
        .unwrap_or_default();
    assert!(text.contains("node-b"), "{text}");
    // a: the log filter form, prefilled with the user; R: the revoke confirmation.
    state.apply(Action::Add);
    let screen = draw(&state, 120, 40);
    assert!(screen.contains("bob"), "{screen}");
    state.apply(Action::Cancel);
    state.apply(Action::Revoke);
    let cmds = state.apply(Action::Confirm);
    assert!(
        matches!(&cmds[..], [Command::Revoke { user, .. }] if user == "bob"),
        "{cmds:?}"
    );

    // A node missing from the cluster's answer.
    let missing: im_console::api::UserDiag =
        serde_json::from_slice(&fixture("user_missing_node.json")).expect("fixture");
    state.on_update(
        0,
        Update::User {
            uid: "bob".into(),
            result: Ok(missing),
        },
        at(t0, 11),
    );
    state.status = None;
    let screen = draw(&state, 120, 40);
    assert!(screen.contains("missing: node-b"), "{screen}");
    insta::assert_snapshot!("users_node_missing", screen);

    // A user nothing is known of: 404.
    state.apply(Action::StartFilter);
    for c in "zed".chars() {
        state.apply(Action::Char(c));
    }
    state.apply(Action::Submit);
    let result = client.user("zed", 50, 20).await;
    assert!(matches!(result, Err(ApiError::Status { status: 404, .. })));
    state.on_update(
        0,
        Update::User {
            uid: "zed".into(),
            result,
        },
        at(t0, 12),
    );
    state.status = None;
    let screen = draw(&state, 120, 40);
    assert!(screen.contains("user zed not found"), "{screen}");
    insta::assert_snapshot!("users_not_found", screen);
}

/// The Trace view (key 9): empty at first; `/` and a msg_id ask the node, whose recorded
/// answer (a message across two nodes) is drawn as a waterfall; an unknown id is the
/// node's 404, said plainly.
#[tokio::test]
async fn trace_view() {
    let (mut state, n, t0) = loaded().await;
    go(&mut state, View::Trace);
    state.status = None;
    insta::assert_snapshot!("trace_empty", draw(&state, 120, 24));

    let id = "01a2454c9182741abb2689668fd423af";
    assert!(state.apply(Action::StartFilter).is_empty());
    for c in "not-hex".chars() {
        state.apply(Action::Char(c));
    }
    assert!(
        state.apply(Action::Submit).is_empty(),
        "a bad id is refused"
    );
    for _ in 0.."not-hex".len() {
        state.apply(Action::Backspace);
    }
    for c in id.chars() {
        state.apply(Action::Char(c));
    }
    let cmds = state.apply(Action::Submit);
    assert_eq!(
        cmds,
        [Command::FetchTrace {
            node: 0,
            msg_id: id.into()
        }]
    );
    n.fixture(
        "GET",
        &format!("/admin/v1/messages/{id}/trace"),
        200,
        "trace.json",
    );
    let client = AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).unwrap();
    let result = client.message_trace(id).await;
    let stages = result.as_ref().map(|t| t.stages.len()).unwrap_or(0);
    assert_eq!(stages, 11);
    state.on_update(
        0,
        Update::Trace {
            msg_id: id.into(),
            result,
        },
        at(t0, 11),
    );
    state.status = None;
    insta::assert_snapshot!("trace_waterfall", draw(&state, 140, 30));

    let unknown = "ffffffffffffffffffffffffffffffff";
    state.apply(Action::StartFilter);
    for _ in 0..id.len() {
        state.apply(Action::Backspace);
    }
    for c in unknown.chars() {
        state.apply(Action::Char(c));
    }
    assert_eq!(state.apply(Action::Submit).len(), 1);
    n.fixture(
        "GET",
        &format!("/admin/v1/messages/{unknown}/trace"),
        404,
        "error_no_trace.json",
    );
    let result = client.message_trace(unknown).await;
    assert!(
        matches!(result, Err(ApiError::Status { status: 404, .. })),
        "{result:?}"
    );
    state.on_update(
        0,
        Update::Trace {
            msg_id: unknown.into(),
            result,
        },
        at(t0, 12),
    );
    state.status = None;
    insta::assert_snapshot!("trace_not_found", draw(&state, 120, 24));
}

/// A multi-region trace: each row names its region and node, the head the regions and
/// the region that did not answer.
#[tokio::test]
async fn trace_view_across_regions() {
    let (mut state, _n, t0) = loaded().await;
    go(&mut state, View::Trace);
    let id = "01a24d6a5ada755e87681b1590b7ace6";
    assert!(state.apply(Action::StartFilter).is_empty());
    for c in id.chars() {
        state.apply(Action::Char(c));
    }
    assert_eq!(state.apply(Action::Submit).len(), 1, "asked for");
    let stage = |region: &str, node: &str, stage: &str, start: u64| im_admin_api::TraceStage {
        node: node.into(),
        stage: stage.into(),
        start_offset_ns: start,
        duration_ns: 1_000_000,
        recipient: None,
        region: Some(region.into()),
    };
    let trace = im_admin_api::MessageTrace {
        msg_id: id.into(),
        sender: "ty2".into(),
        conversation: "u:tx2:ty2".into(),
        seq: 1,
        nodes: vec!["b0".into(), "a1".into()],
        stages: vec![
            stage("b", "b0", "region_forward", 0),
            stage("a", "a1", "persist_commit", 20_000_000),
            stage("b", "b0", "repl_apply", 70_000_000),
        ],
        regions: vec!["b".into(), "a".into()],
        regions_unanswered: vec!["c".into()],
        ..Default::default()
    };
    state.on_update(
        0,
        Update::Trace {
            msg_id: id.into(),
            result: Ok(trace),
        },
        at(t0, 11),
    );
    state.status = None;
    let screen = draw(&state, 140, 30);
    for want in [
        "b/b0",
        "a/a1",
        "region_forward",
        "repl_apply",
        "regions b, a",
        "no answer from region c",
    ] {
        assert!(screen.contains(want), "{want} missing:\n{screen}");
    }
}

/// `m` on the Logs view's live tail opens the Trace view on the selected line's msg_id.
#[tokio::test]
async fn m_on_a_tail_line_traces_its_message() {
    let (mut state, n, t0) = loaded().await;
    n.fixture("GET", "/admin/v1/logs/tail", 200, "log_tail.ndjson");
    go(&mut state, View::Logs);
    assert_eq!(
        state.apply(Action::TraceMessage),
        [],
        "no tail, nothing to trace"
    );
    let cmds = state.apply(Action::Tail);
    let [Command::StartTail {
        uid, generation, ..
    }] = cmds.as_slice()
    else {
        panic!("f opens a tail: {cmds:?}");
    };
    let client = AdminClient::new(&n.url, Some("x".into()), Duration::from_secs(5)).unwrap();
    let mut tail = client.log_tail(uid, None, 200).await.expect("tail opens");
    let mut lines = Vec::new();
    while let Some(l) = tail.next_line().await.expect("a line") {
        lines.push(l);
    }
    let generation = *generation;
    state.on_update(0, Update::TailLines { generation, lines }, at(t0, 11));
    // The newest line (a deliver ack) names no message: the nearest older one does.
    assert_eq!(
        state.apply(Action::TraceMessage),
        [Command::FetchTrace {
            node: 0,
            msg_id: "01a2454c9182741abb2689668fd423af".into()
        }]
    );
    assert_eq!(state.view, View::Trace);
}

#[tokio::test]
async fn webhooks_endpoints_parked_test_fire_and_redeliver() {
    let (mut state, n, t0) = loaded().await;
    n.fixture("GET", "/admin/v1/webhooks", 200, "webhooks.json");
    n.fixture(
        "GET",
        "/admin/v1/webhooks/parked",
        200,
        "webhooks_parked.json",
    );
    go(&mut state, View::Webhooks);
    assert!(state.plan(0).webhooks, "the view polls the webhooks");
    let c = AdminClient::new(&n.url, None, Duration::from_secs(5)).expect("client");
    state.on_update(0, Update::Webhooks(c.webhooks().await), at(t0, 11));
    state.on_update(
        0,
        Update::Parked(c.webhooks_parked("", 100).await),
        at(t0, 11),
    );
    insta::assert_snapshot!("webhooks", draw(&state, 140, 24));
    // `c` test-fires the selected endpoint; the answer goes to the status line.
    state.apply(Action::Down);
    let cmds = state.apply(Action::Add);
    let name = match &cmds[..] {
        [Command::TestFire { name, .. }] => name.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(name, "audit");
    let result = Ok(im_console::api::TestFired {
        event_id: "0193a9e4c1a27c3b8e0f5d4c3b2a1999".into(),
        status: 200,
        error: String::new(),
        took_ms: 12,
    });
    state.on_update(0, Update::TestFired { name, result }, at(t0, 12));
    // `e` redelivers the selected endpoint's parked events.
    state.apply(Action::Up);
    let cmds = state.apply(Action::Redeliver);
    assert!(
        matches!(&cmds[..], [Command::Redeliver { name, .. }] if name == "push"),
        "{cmds:?}"
    );
    let result = Ok(im_console::api::Redelivered { queued: 2 });
    state.on_update(
        0,
        Update::Redelivered {
            name: "push".into(),
            result,
        },
        at(t0, 13),
    );
    insta::assert_snapshot!("webhooks_redelivered_status", draw(&state, 140, 24));
}
