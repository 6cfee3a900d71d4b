//! The runtime and task figures move under real load: SDK clients send through the real
//! binary, and between two scrapes the writer's and router's monitored polls and the
//! runtime workers' busy time grow; the overview carries the `runtime` object; with
//! `obs.task_monitors` off the runtime is still read and no task is monitored.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// Load is driven until the figures move, at most this long (a loaded machine is slow).
const LOAD_LIMIT: Duration = Duration::from_secs(120);

/// Sum of a per-worker counter over the workers.
fn busy_secs(scrape: &str) -> f64 {
    metric_value(scrape, "im_runtime_worker_busy_seconds_total", &[])
}

fn overview(server: &TestServer) -> Value {
    let (status, body) = server.admin_get("/admin/v1/overview");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("overview is JSON")
}

/// The entry of `task` in `overview.runtime.tasks`.
fn task<'a>(o: &'a Value, name: &str) -> Option<&'a Value> {
    o["runtime"]["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["task"] == name)
}

/// Sends `per_client` messages from each client to its partner, all at once, acked.
async fn drive(clients: &[(im_client::Client, String)], per_client: usize) {
    let mut sends = Vec::new();
    for (c, to) in clients {
        for i in 0..per_client {
            sends.push(c.send_text(to.clone(), format!("load {i}")));
        }
    }
    for r in futures_util::future::join_all(sends).await {
        r.expect("send acked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_and_task_figures_move_under_load() {
    let server = TestServer::start_with(&[("IM_OBS_SAMPLE_INTERVAL_MS", "200")]);
    // The sampler's first sample has run and been published: the series exist and the
    // overview carries it (the gauges are set a moment before the snapshot is swapped in).
    eventually("the runtime series and the overview's runtime", || {
        server.metric("im_runtime_workers", &[]) > 0.0
            && overview(&server)["runtime"]["busy_secs_total"].is_f64()
    })
    .await;
    let first = server.metrics();
    let workers = metric_value(&first, "im_runtime_workers", &[]);
    assert!(workers >= 1.0, "workers {workers}");
    for t in ["writer", "router", "receipts"] {
        assert_eq!(
            metric_value(&first, "im_task_instrumented_total", &[("task", t)]),
            1.0,
            "one {t} task monitored"
        );
        assert_eq!(
            metric_value(&first, "im_task_alive", &[("task", t)]),
            1.0,
            "the {t} task alive"
        );
    }
    // A single node has no cluster link: its kinds exist, at zero.
    assert_eq!(
        metric_value(
            &first,
            "im_task_instrumented_total",
            &[("task", "cluster_inbound")]
        ),
        0.0
    );
    let polls0 = metric_value(&first, "im_task_polls_total", &[("task", "writer")]);
    let router0 = metric_value(&first, "im_task_polls_total", &[("task", "router")]);
    let busy0 = busy_secs(&first);
    let o0 = overview(&server);
    let busy_total0 = o0["runtime"]["busy_secs_total"]
        .as_f64()
        .expect("overview.runtime.busy_secs_total");

    // Pairs of SDK clients, each sending to its partner.
    let mut clients = Vec::new();
    for i in 0..6 {
        let me = format!("rt{i}");
        let to = format!("rt{}", i ^ 1);
        clients.push((server.client(&me).await, to));
    }
    let started = Instant::now();
    let mut sent = 0;
    loop {
        drive(&clients, 50).await;
        sent += clients.len() * 50;
        let scrape = server.metrics();
        let polls = metric_value(&scrape, "im_task_polls_total", &[("task", "writer")]);
        let router = metric_value(&scrape, "im_task_polls_total", &[("task", "router")]);
        let busy = busy_secs(&scrape);
        // The counters count whole seconds of busy time: load until one more has passed.
        if polls > polls0 + 10.0 && router > router0 + 10.0 && busy > busy0 {
            break;
        }
        assert!(
            started.elapsed() < LOAD_LIMIT,
            "after {sent} sends: writer polls {polls0} -> {polls}, router polls {router0} -> \
             {router}, busy seconds {busy0} -> {busy}"
        );
    }

    // The overview has the runtime object, its figures moved the same way.
    let mut o = overview(&server);
    eventually("the overview to see the load", || {
        o = overview(&server);
        task(&o, "writer").is_some_and(|t| t["polls_total"].as_f64() > Some(polls0))
    })
    .await;
    let r = &o["runtime"];
    assert_eq!(r["workers"].as_f64(), Some(workers), "{r}");
    assert_eq!(
        r["worker_busy_ratio"].as_array().map(|a| a.len() as f64),
        Some(workers),
        "{r}"
    );
    assert!(
        r["alive_tasks"].as_u64() > Some(6),
        "connections' tasks: {r}"
    );
    assert!(r["busy_secs_total"].as_f64() > Some(busy_total0), "{r}");
    assert_eq!(r["task_monitors"], true);
    assert_eq!(r["slow_poll_threshold_us"], 1000);
    let names: Vec<&str> = r["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["task"].as_str())
        .collect();
    assert_eq!(names, ["writer", "router", "receipts"], "{r}");
    let w = task(&o, "writer").expect("writer");
    assert_eq!(w["alive"], 1);
    assert!(w["scheduled_total"].as_u64() > Some(0), "{w}");
    assert!(w["poll_secs_total"].as_f64() > Some(0.0), "{w}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_monitors_off() {
    let server = TestServer::start_with(&[
        ("IM_OBS_SAMPLE_INTERVAL_MS", "200"),
        ("IM_OBS_TASK_MONITORS", "false"),
    ]);
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;
    for i in 0..20 {
        alice
            .send_text("bob", format!("m{i}"))
            .await
            .expect("acked");
    }
    bob.next_message(WAIT).await.expect("delivered");
    eventually("the overview's runtime object", || {
        overview(&server)["runtime"]["workers"].as_u64() > Some(0)
    })
    .await;
    let o = overview(&server);
    assert_eq!(o["runtime"]["task_monitors"], false, "{}", o["runtime"]);
    assert_eq!(o["runtime"]["tasks"], serde_json::json!([]));
    let scrape = server.metrics();
    assert_eq!(
        metric_value(&scrape, "im_task_polls_total", &[("task", "writer")]),
        0.0
    );
    assert_eq!(
        metric_value(&scrape, "im_task_instrumented_total", &[("task", "writer")]),
        0.0
    );
}
