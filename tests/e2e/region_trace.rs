//! Multi-region observability against two real regions (2 nodes each, a NATS cluster
//! per region joined by a delayed gateway, a Postgres database per region): a traced
//! Send made in region b for a conversation homed in a has one timeline with b's
//! stages (decode, validate, region_forward, apply_wait), a's (persist, route, the
//! push to a's recipient, repl_publish) and the replication back into b (repl_apply,
//! the push to b's recipient), each stage with its region, asked from either region;
//! with the gateway cut, the answer names region a as unanswered instead of failing.
//! And a region started with a different `regions` list is refused: nothing applied
//! from it, forwards to it refused, `im_region_config_mismatch` 1 and the overview
//! pair's `config_mismatch`.

use std::time::{Duration, Instant};

use im_admin_api::MessageTrace;

use crate::support::regions::{Regions, Setup};

const DELAY: Duration = Duration::from_millis(20);
const KEY: &str = "region-trace-test-cluster-key-of-32-bytes";

/// Waits until every region's applier reached the other region's stream.
async fn links_up(regions: &Regions) {
    for (to, from) in [("a", "b"), ("b", "a")] {
        let end = Instant::now() + Duration::from_secs(30);
        while !regions
            .region(to)
            .nodes
            .iter()
            .any(|n| n.metric("im_region_link_up", &[("from", from), ("to", to)]) == 1.0)
        {
            assert!(Instant::now() < end, "{to}'s applier never reached {from}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// (region, node, stage, recipient) of every stage of `t`.
fn rows(t: &MessageTrace) -> Vec<(String, String, String, String)> {
    t.stages
        .iter()
        .map(|s| {
            (
                s.region.clone().unwrap_or_default(),
                s.node.clone(),
                s.stage.clone(),
                s.recipient.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Whether `t` has `stage` recorded in `region` (for `recipient`, when given).
fn has(t: &MessageTrace, region: &str, stage: &str, recipient: Option<&str>) -> bool {
    t.stages.iter().any(|s| {
        s.region.as_deref() == Some(region)
            && s.stage == stage
            && recipient.is_none_or(|r| s.recipient.as_deref() == Some(r))
    })
}

/// The stages a cross-region trace must hold: (region, stage, recipient).
fn wanted<'a>(x: &'a str, y: &'a str) -> Vec<(&'static str, &'static str, Option<&'a str>)> {
    vec![
        ("b", "decode", None),
        ("b", "validate", None),
        ("b", "region_forward", None),
        ("b", "apply_wait", None),
        ("a", "validate", None),
        ("a", "persist_wait", None),
        ("a", "persist_commit", None),
        ("a", "route", None),
        ("a", "write", Some(x)),
        ("a", "repl_publish", None),
        ("b", "repl_apply", None),
        ("b", "route", None),
        ("b", "write", Some(y)),
    ]
}

/// The trace of `msg_id` asked from `node` once it has every wanted stage.
async fn full_trace(
    node: &crate::support::TestServer,
    msg_id: &str,
    (x, y): (&str, &str),
) -> MessageTrace {
    let path = format!("/admin/v1/messages/{msg_id}/trace");
    let mut last = String::new();
    for _ in 0..100 {
        let (status, body) = node.admin_get(&path);
        if status == 200 {
            let t: MessageTrace = serde_json::from_str(&body).expect("trace JSON");
            if wanted(x, y).iter().all(|(r, s, to)| has(&t, r, s, *to)) {
                return t;
            }
        }
        last = format!("{status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no full cross-region trace of {msg_id}: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_send_has_one_timeline_across_regions() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    let setup = Setup {
        env: vec![("IM_CLUSTER_KEY", KEY)],
        ..Setup::default()
    };
    let regions = Regions::start_with(&["a", "b"], (2, 2), DELAY, true, &setup).await;
    links_up(&regions).await;
    let (ra, rb) = (regions.region("a"), regions.region("b"));
    // x in region a, y in region b, their conversation homed in a; y is filtered (traced)
    // on region b's nodes only: the home and the replication trace it from the context.
    let (x, y) = crate::regions::pair_homed("t", "a");
    for n in &rb.nodes {
        let path = format!("/admin/v1/log-filters/{y}");
        let (status, body) = n.admin_json("PUT", &path, r#"{"level":"debug","ttl_secs":600}"#);
        assert_eq!(status, 200, "{body}");
    }
    let cx = ra.nodes[1].client(&x).await;
    let cy = rb.nodes[0].client(&y).await;
    let ack = cy
        .send(
            im_client::Target::User(x.clone()),
            im_client::proto::MessageType::Text,
            "traced across",
            None,
        )
        .await
        .expect("forwarded send acked");
    let t = full_trace(&rb.nodes[0], &ack.msg_id, (&x, &y)).await;
    for s in &t.stages {
        eprintln!(
            "{:>2} {:>3} {:<15} {:>10.3} ms {:>8.3} ms {}",
            s.region.as_deref().unwrap_or_default(),
            s.node,
            s.stage,
            s.start_offset_ns as f64 / 1e6,
            s.duration_ns as f64 / 1e6,
            s.recipient.as_deref().unwrap_or_default()
        );
    }
    assert_eq!((t.sender.as_str(), t.seq), (y.as_str(), ack.seq), "{t:?}");
    assert_eq!(t.regions.first().map(String::as_str), Some("b"), "{t:?}");
    assert!(t.regions.contains(&"a".to_owned()), "{t:?}");
    assert!(t.regions_unanswered.is_empty(), "{t:?}");
    assert!(t.stages.iter().all(|s| s.region.is_some()), "{t:?}");
    // The forward's stages are the forwarding node's; b's nodes are b0/b1, a's a0/a1.
    for (region, node, _, _) in rows(&t) {
        assert!(
            node.starts_with(&region),
            "{node} recorded in {region}: {t:?}"
        );
    }
    let forward = t
        .stages
        .iter()
        .find(|s| s.stage == "region_forward")
        .expect("forward");
    assert_eq!(forward.node, "b0");
    assert!(
        forward.duration_ns >= 2 * DELAY.as_nanos() as u64,
        "a forward crosses the gateway twice: {forward:?}"
    );
    // Asked from the home region: the same stages (its own and b's, over the gateway).
    let from_a = full_trace(&ra.nodes[0], &ack.msg_id, (&x, &y)).await;
    assert_eq!(from_a.regions.first().map(String::as_str), Some("a"));
    assert_eq!(from_a.stages.len(), t.stages.len(), "{from_a:?}\n{t:?}");
    assert_eq!(rb.nodes[0].metric("im_trace_bad_replies_total", &[]), 0.0);

    // Region a cut off: b's answer holds b's stages and names a as unanswered.
    regions.regions.iter().for_each(|r| r.cut_gateway());
    let path = format!("/admin/v1/messages/{}/trace", ack.msg_id);
    let asked = Instant::now();
    let (status, body) = rb.nodes[0].admin_get(&path);
    let took = asked.elapsed();
    assert_eq!(status, 200, "{body}");
    let cut: MessageTrace = serde_json::from_str(&body).expect("trace JSON");
    assert_eq!(cut.regions_unanswered, ["a"], "{cut:?}");
    assert!(has(&cut, "b", "region_forward", None) && !has(&cut, "a", "route", None));
    assert!(took < Duration::from_secs(5), "bounded: {took:?}");
    regions.regions.iter().for_each(|r| r.heal_gateway());
    drop((cx, cy));
}

fn user(u: &str) -> im_client::Target {
    im_client::Target::User(u.to_owned())
}

fn text() -> im_client::proto::MessageType {
    im_client::proto::MessageType::Text
}

/// A Send refused with REGION_UNAVAILABLE for the regions lists.
fn refused(r: Result<im_client::proto::SendAck, im_client::ClientError>) {
    match r {
        Err(im_client::ClientError::Server { code, message, .. }) => {
            assert_eq!(code, im_client::proto::ErrorCode::RegionUnavailable);
            assert!(message.contains("regions list"), "{message}");
        }
        other => panic!("expected a refusal for the lists, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_with_another_list_is_refused() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    // Region b lists [b, a], region a [a, b]: the same homes, another configuration.
    let setup = Setup {
        reversed_list: Some("b"),
        ..Setup::default()
    };
    let regions = Regions::start_with(&["a", "b"], (1, 1), DELAY, true, &setup).await;
    let (ra, rb) = (regions.region("a"), regions.region("b"));
    let (x, y) = crate::regions::pair_homed("m", "a");
    let cx = ra.nodes[0].client(&x).await;
    let cy = rb.nodes[0].client(&y).await;
    // Before b has seen anything of a's: the home a refuses b's forward by its digest.
    refused(cy.send(user(&x), text(), "from b, first", None).await);
    assert_eq!(
        ra.nodes[0].metric("im_region_config_mismatch", &[("from", "b")]),
        1.0
    );
    // Committed at its home a, published; b sees a's digest and applies nothing.
    let ack = cx
        .send(user(&y), text(), "from a", None)
        .await
        .expect("a home send");
    let end = Instant::now() + Duration::from_secs(30);
    while rb.nodes[0].metric("im_region_config_mismatch", &[("from", "a")]) != 1.0 {
        assert!(Instant::now() < end, "b never saw a's different list");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, body) = rb.nodes[0].admin_get("/admin/v1/overview");
    let o: serde_json::Value = serde_json::from_str(&body).expect("overview JSON");
    let pair = o["regions"]
        .as_array()
        .and_then(|r| r.iter().find(|p| p["from"] == "a").cloned())
        .unwrap_or_default();
    assert_eq!(pair["config_mismatch"], true, "{body}");
    // A forward from b to a is refused, by b itself now that it knows.
    refused(cy.send(user(&x), text(), "from b", None).await);
    // Nothing of a's was applied in b (b's store has no row of the conversation).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rb.nodes[0].metric("im_region_applied_total", &[("from", "a"), ("to", "b")]),
        0.0
    );
    let _ = ack;
    drop((cx, cy));
}
