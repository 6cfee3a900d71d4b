//! Regions: the test harness itself (two regions of two nodes, each region its own
//! nats-server cluster and Postgres database, a gateway between them through a latency
//! proxy): the link carries the delay, can be cut and heals, and a region can be killed
//! while the other carries on.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::support::metric_value;
use crate::support::regions::Regions;

const DELAY: Duration = Duration::from_millis(40);

/// Publishes on `from` until `sub` receives one, or `limit` passes; the time from the
/// last publish to its receipt.
async fn first_across(
    from: &async_nats::Client,
    sub: &mut async_nats::Subscriber,
    subject: &str,
    limit: Duration,
) -> Option<Duration> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let t0 = Instant::now();
        from.publish(subject.to_owned(), "x".into()).await.ok()?;
        from.flush().await.ok()?;
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            return Some(t0.elapsed());
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_gateway_delays_cuts_and_heals() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    let mut regions = Regions::start(&["a", "b"], 2, 2, DELAY, false).await;
    // Each region's nodes see their own two nodes only (checked by start), and the
    // gateway link carries the proxy's delay.
    let a = async_nats::connect(regions.region("a").nats_url(0))
        .await
        .expect("nats a");
    let b = async_nats::connect(regions.region("b").nats_url(1))
        .await
        .expect("nats b");
    let subject = format!("{}.probe", regions.region("a").prefix);
    let mut sub = b.subscribe(subject.clone()).await.expect("subscribe");
    b.flush().await.expect("flush");
    let took = first_across(&a, &mut sub, &subject, Duration::from_secs(15))
        .await
        .expect("a message from region a reaches region b");
    assert!(took >= DELAY, "one way across the gateway took {took:?}");
    let accepted =
        regions.region("b").proxies[0].accepted() + regions.region("b").proxies[1].accepted();
    assert!(accepted > 0, "gateway connections go through the proxy");

    // Cut: nothing crosses.
    regions.regions.iter().for_each(|r| r.cut_gateway());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        first_across(&a, &mut sub, &subject, Duration::from_secs(2))
            .await
            .is_none(),
        "a message crossed a cut gateway"
    );
    // Heal: the gateways reconnect by themselves.
    regions.regions.iter().for_each(|r| r.heal_gateway());
    first_across(&a, &mut sub, &subject, Duration::from_secs(30))
        .await
        .expect("the gateway heals");

    // Losing region b leaves region a's nodes serving.
    regions.region_mut("b").kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in &regions.region("a").nodes {
        let c = n.client("alice").await;
        let ack = c.send_text("bob", "still here").await;
        assert!(
            ack.is_ok(),
            "region a sends after region b is lost: {ack:?}"
        );
        c.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_route_lists_regions_and_the_sdk_joins_the_nearest() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    // Without regions the answer is what it always was: no region fields.
    let single = crate::support::TestServer::start();
    let (status, body) = crate::support::http(single.client_addr, "GET", "/v1/route", None);
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("region"), "{body}");
    drop(single);

    let mut regions = Regions::start(&["a", "b"], 2, 2, DELAY, true).await;
    // Region a is far (60 ms each way to its entry point), region b near.
    regions
        .region("a")
        .entry
        .set_delay(Duration::from_millis(60));
    let a = regions.region("a");
    let (status, body) = crate::support::http(a.nodes[1].client_addr, "GET", "/v1/route", None);
    assert_eq!(status, 200, "{body}");
    let answer: im_admin_api::RouteAnswer = serde_json::from_str(&body).expect("route JSON");
    assert_eq!(answer.region, "a");
    let listed: Vec<(String, String)> = answer
        .regions
        .iter()
        .map(|r| (r.name.clone(), r.route_url.clone()))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("a".to_owned(), a.entry_url()),
            ("b".to_owned(), regions.region("b").entry_url())
        ]
    );

    // The app knows only region a's entry point; the SDK probes both and joins b.
    let mut cfg = im_client::ClientConfig::new("", a.nodes[0].token("alice"));
    cfg.route_urls = vec![a.entry_url()];
    cfg.reconnect_max = Duration::from_millis(500);
    let book = cfg.regions.clone();
    let alice = im_client::Client::connect(cfg).await.expect("connect");
    let order: Vec<String> = book.order().into_iter().map(|p| p.name).collect();
    assert_eq!(order, ["b", "a"], "probes: {:?}", book.order());
    assert!(
        alice.node_id().starts_with('b'),
        "joined {}",
        alice.node_id()
    );
    // One writer per conversation: a region commits only the conversations homed there
    // and forwards the others' Sends to their home, acked after the home's commit.
    let names = ["a".to_owned(), "b".to_owned()];
    let peer_homed = |home: &str| {
        (0..100)
            .map(|i| format!("peer{i}"))
            .find(|p| {
                let c = im_client::proto::direct_conversation("alice", p);
                im_server::region::home_of(&c, &names) == Some(home)
            })
            .expect("a peer for each home")
    };
    let (in_a, in_b) = (peer_homed("a"), peer_homed("b"));
    let local = alice.send_text(&in_b, "from b").await.expect("send in b");
    let forwarded = alice
        .send_text(&in_a, "forwarded to a")
        .await
        .expect("send forwarded from b to a");
    let again = alice
        .send_text(&in_a, "forwarded again")
        .await
        .expect("second forwarded send");
    assert_eq!(
        (forwarded.seq, again.seq),
        (1, 2),
        "gapless seqs at the home"
    );
    let (in_a_conv, in_b_conv) = (
        im_client::proto::direct_conversation("alice", &in_a),
        im_client::proto::direct_conversation("alice", &in_b),
    );
    // A group homed in region a, made and written to from region b; carol, a member
    // connected to region a, gets the pushes from her own region's commit.
    let group = (0..100)
        .map(|i| format!("team{i}"))
        .find(|g| im_server::region::home_of(&format!("g:{g}"), &names) == Some("a"))
        .expect("a group homed in a");
    let carol = regions.region("a").nodes[1].client("carol").await;
    alice
        .group_op(
            im_client::proto::group_op::Op::Create,
            group.clone(),
            vec!["carol".into()],
        )
        .await
        .expect("group created at its home through region b");
    let mut group_acks = Vec::new();
    for i in 0..3 {
        let ack = alice
            .send(
                im_client::Target::Group(group.clone()),
                im_client::proto::MessageType::Text,
                format!("group {i}"),
                None,
            )
            .await
            .expect("group send forwarded");
        group_acks.push(ack);
    }
    let seqs: Vec<u64> = group_acks.iter().map(|a| a.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gapless group seqs at the home: {seqs:?}"
    );
    for ack in &group_acks {
        // The group's own notice (its creation) comes first.
        let m = loop {
            let m = carol
                .next_message(Duration::from_secs(10))
                .await
                .expect("carol's push in region a");
            if m.seq >= group_acks[0].seq {
                break m;
            }
        };
        assert_eq!((m.seq, &m.msg_id), (ack.seq, &ack.msg_id));
    }
    carol.close().await;
    let group_conv = format!("g:{group}");
    let mut acked = vec![
        (in_a_conv.clone(), 1, forwarded.msg_id.clone()),
        (in_a_conv.clone(), 2, again.msg_id.clone()),
    ];
    acked.extend(
        group_acks
            .iter()
            .map(|a| (group_conv.clone(), a.seq as i64, a.msg_id.clone())),
    );
    let in_a_store = stored(&regions, "a").await;
    for row in &acked {
        let n = in_a_store.iter().filter(|r| r.2 == row.2).count();
        assert_eq!(n, 1, "{row:?} stored {n} times at the home");
        assert!(in_a_store.contains(row), "{row:?} not at its acked seq");
    }
    for conv in [&in_a_conv, &group_conv] {
        let seqs: Vec<i64> = in_a_store
            .iter()
            .filter(|r| &r.0 == conv)
            .map(|r| r.1)
            .collect();
        assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "{conv}");
    }
    // Region b holds its own conversation as it committed it (and copies of region
    // a's, replicated: `regions_replicate_messages_both_ways_and_catch_up_after_a_cut`).
    let in_b_rows: Vec<_> = stored(&regions, "b")
        .await
        .into_iter()
        .filter(|r| r.0 == in_b_conv)
        .collect();
    assert_eq!(
        in_b_rows,
        vec![(in_b_conv, 1, local.msg_id.clone())],
        "region b committed its own conversation once"
    );

    // Region b is lost: the SDK fails over to region a by itself.
    regions.region_mut("b").kill();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if alice.node_id().starts_with('a') && alice.is_connected() {
            break;
        }
        assert!(Instant::now() < end, "still on {}", alice.node_id());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    alice.send_text(&in_a, "from a").await.expect("send in a");
    refused_for_home(alice.send_text(&in_b, "b is down").await, "b");
    alice.close().await;
}

/// Every stored message of region `name`: (conversation, seq, msg_id), in order.
async fn stored(regions: &Regions, name: &str) -> Vec<(String, i64, String)> {
    let pool = sqlx::PgPool::connect(&regions.region(name).db_url)
        .await
        .expect("region database");
    let rows = sqlx::query_as(
        "SELECT conversation_id, seq, msg_id FROM messages ORDER BY conversation_id, seq",
    )
    .fetch_all(&pool)
    .await
    .expect("query");
    pool.close().await;
    rows
}

/// `r` is the refusal of a Send whose conversation is homed in region `home`.
fn refused_for_home(r: Result<im_client::proto::SendAck, im_client::ClientError>, home: &str) {
    match r {
        Err(im_client::ClientError::Server { code, message, .. }) => {
            assert_eq!(
                code,
                im_client::proto::ErrorCode::RegionUnavailable,
                "{message}"
            );
            assert!(
                message.contains(&format!("homed in region {home}")),
                "{message}"
            );
        }
        other => panic!("expected REGION_UNAVAILABLE naming {home}, got {other:?}"),
    }
}

/// A pair of users (`x` in region a, `y` in region b by who connects where) whose
/// one-to-one conversation is homed in `home`.
pub(crate) fn pair_homed(tag: &str, home: &str) -> (String, String) {
    let names = ["a".to_owned(), "b".to_owned()];
    (0..200)
        .map(|i| (format!("{tag}x{i}"), format!("{tag}y{i}")))
        .find(|(x, y)| {
            let c = im_client::proto::direct_conversation(x, y);
            im_server::region::home_of(&c, &names) == Some(home)
        })
        .expect("a pair for each home")
}

/// Who sends what in the replication test: (sender's client, target, text).
type Acked = Vec<(String, u64, String)>;

/// One message from `from` to `target`, acked: its (conversation, seq, msg_id).
async fn sent(
    from: &im_client::Client,
    target: im_client::Target,
    text: String,
) -> (String, u64, String) {
    let ack = from
        .send(target, im_client::proto::MessageType::Text, text, None)
        .await
        .unwrap_or_else(|e| panic!("{} sends: {e:?}", from.user_id()));
    (ack.conversation_id.clone(), ack.seq, ack.msg_id.clone())
}

/// Waits until both regions hold the same rows for `convs`, every one of `acked`
/// exactly once at its acked seq, each conversation's seqs gapless from 1; how long
/// it took. Panics after `limit` with what differs.
async fn replicated(
    regions: &Regions,
    convs: &[String],
    acked: &Acked,
    limit: Duration,
) -> Duration {
    let t0 = Instant::now();
    loop {
        let of = |rows: Vec<(String, i64, String)>| -> Vec<(String, i64, String)> {
            rows.into_iter().filter(|r| convs.contains(&r.0)).collect()
        };
        let (a, b) = (
            of(stored(regions, "a").await),
            of(stored(regions, "b").await),
        );
        let complete = acked.iter().all(|(c, s, m)| {
            let here = |rows: &[(String, i64, String)]| {
                rows.iter().filter(|r| &r.2 == m).count() == 1
                    && rows.contains(&(c.clone(), *s as i64, m.clone()))
            };
            here(&a) && here(&b)
        });
        if complete && a == b {
            for conv in convs {
                let seqs: Vec<i64> = a.iter().filter(|r| &r.0 == conv).map(|r| r.1).collect();
                assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "{conv}");
            }
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "not replicated within {limit:?}: {} acked, a {} rows, b {} rows",
            acked.len(),
            a.len(),
            b.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `c` got a push of every message of `want` (by msg_id; other messages
/// and repeats are skipped).
async fn pushed(c: &im_client::Client, want: &[String]) {
    let mut missing: std::collections::HashSet<&String> = want.iter().collect();
    while !missing.is_empty() {
        let m = c
            .next_message(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{}: {} pushes missing: {e:?}", c.user_id(), missing.len()));
        missing.remove(&m.msg_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_replicate_messages_both_ways_and_catch_up_after_a_cut() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    let mut regions = Regions::start(&["a", "b"], 2, 2, DELAY, true).await;
    // Replication runs: each region's applier reached the other's stream.
    let t0 = Instant::now();
    lag_reported(&regions, false).await;
    eprintln!("replication up {:?} after the nodes", t0.elapsed());
    let (ra, rb) = (regions.region("a"), regions.region("b"));
    // x1 (region a) and y1 (region b) talk in a conversation homed in a, x2 (a) and
    // y2 (b) in one homed in b; x1 and y1 share a group homed in a, made from region b.
    let ((x1, y1), (x2, y2)) = (pair_homed("p", "a"), pair_homed("q", "b"));
    let (cx1, cy1) = (ra.nodes[0].client(&x1).await, rb.nodes[1].client(&y1).await);
    let (cx2, cy2) = (ra.nodes[1].client(&x2).await, rb.nodes[0].client(&y2).await);
    let names = ["a".to_owned(), "b".to_owned()];
    let group = (0..100)
        .map(|i| format!("crew{i}"))
        .find(|g| im_server::region::home_of(&format!("g:{g}"), &names) == Some("a"))
        .expect("a group homed in a");
    cy1.group_op(
        im_client::proto::group_op::Op::Create,
        group.clone(),
        vec![x1.clone()],
    )
    .await
    .expect("group made from region b at its home a");
    let convs = vec![
        im_client::proto::direct_conversation(&x1, &y1),
        im_client::proto::direct_conversation(&x2, &y2),
        format!("g:{group}"),
    ];
    let user = |u: &str| im_client::Target::User(u.to_owned());
    let to_group = || im_client::Target::Group(group.clone());
    let mut acked: Acked = Vec::new();
    // (recipient's client, the msg_ids it must get pushed)
    let mut want: [Vec<String>; 4] = Default::default();
    for i in 0..5 {
        let rows = [
            (sent(&cx1, user(&y1), format!("x1 {i}")).await, 1),
            (sent(&cy1, user(&x1), format!("y1 {i}")).await, 0),
            (sent(&cx2, user(&y2), format!("x2 {i}")).await, 3),
            (sent(&cy2, user(&x2), format!("y2 {i}")).await, 2),
            (sent(&cx1, to_group(), format!("g x1 {i}")).await, 1),
            (sent(&cy1, to_group(), format!("g y1 {i}")).await, 0),
        ];
        for (row, to) in rows {
            want[to].push(row.2.clone());
            acked.push(row);
        }
    }
    let took = replicated(&regions, &convs, &acked, Duration::from_secs(30)).await;
    eprintln!(
        "replicated {} messages both ways within {took:?}",
        acked.len()
    );
    edit_and_recall_across(&regions, (&cy1, &cx2), &convs, &mut acked).await;
    server_messages_at_the_home_only(&regions);
    let clients = [&cx1, &cy1, &cx2, &cy2];
    for (c, w) in clients.iter().zip(&want) {
        pushed(c, w).await;
    }
    reads_across(&regions, (&cy1, &cx1), &mut acked).await;
    lag_reported(&regions, true).await;
    cut_and_heal(&regions, &clients, &convs, &mut acked, (&y1, &x2, &x1)).await;
    // Node 0 of each region dies (SIGKILL) right after acking Sends of its own homes:
    // node 1 takes over whatever replication role node 0 held (publishing what node 0
    // committed and had not published), and the Sends forwarded between the two node
    // 1s replicate.
    for i in 0..5 {
        let user = |u: &str| im_client::Target::User(u.to_owned());
        acked.push(sent(&cx1, user(&y1), format!("before the kill x1 {i}")).await);
        acked.push(sent(&cy2, user(&x2), format!("before the kill y2 {i}")).await);
    }
    for name in ["a", "b"] {
        let node0 = &regions.region(name).nodes[0];
        let published = node0.metrics().contains("im_region_published_total{");
        eprintln!("region {name}: node 0 published (held the publisher role): {published}");
    }
    regions.region_mut("a").nodes[0].kill();
    regions.region_mut("b").nodes[0].kill();
    let killed = Instant::now();
    for c in [cx1, cy2] {
        c.close().await;
    }
    for i in 0..5 {
        let user = |u: &str| im_client::Target::User(u.to_owned());
        acked.push(sent(&cy1, user(&x1), format!("after the kill y1 {i}")).await);
        acked.push(sent(&cx2, user(&y2), format!("after the kill x2 {i}")).await);
    }
    replicated(&regions, &convs, &acked, Duration::from_secs(60)).await;
    eprintln!(
        "node 0 of each region killed: {} messages in all replicated {:?} after the kill",
        acked.len(),
        killed.elapsed()
    );
    for c in [cy1, cx2] {
        c.close().await;
    }
}

/// Read cursors and receipts cross regions: x1 (region a) sends y1 (region b) one more
/// message in their conversation homed in a; y1 marks it read in region b. x1, connected
/// in region a only, gets the ReadReceipt (pushed by region a once it applied the
/// replicated cursor), and y1's conversation read from region a's store shows it read
/// (no unread left).
async fn reads_across(
    regions: &Regions,
    (cy1, cx1): (&im_client::Client, &im_client::Client),
    acked: &mut Acked,
) {
    use im_client::Event;
    let y1 = cy1.user_id().to_owned();
    let row = sent(cx1, im_client::Target::User(y1.clone()), "read me".into()).await;
    let (conv, seq) = (row.0.clone(), row.1);
    acked.push(row.clone());
    let in_a = regions.region("a").nodes[1].client(&y1).await;
    let before = summary(&in_a, &conv).await;
    assert!(before.unread > 0 && before.read_seq < seq, "{before:?}");
    // Region b applied the message (pushed to y1) before y1 may mark it read there.
    loop {
        let m = cy1
            .next_message(Duration::from_secs(30))
            .await
            .expect("the message pushed in b");
        if m.msg_id == row.2 {
            break;
        }
    }
    let t = Instant::now();
    cy1.mark_read(conv.clone(), seq)
        .await
        .expect("marked read in b");
    let receipt = loop {
        match tokio::time::timeout(Duration::from_secs(15), cx1.next_event()).await {
            Ok(Some(Event::ReadReceipt(r))) if r.user_id == y1 && r.conversation_id == conv => {
                break r
            }
            Ok(Some(_)) => {}
            other => panic!("no read receipt in region a: {other:?}"),
        }
    };
    assert_eq!(receipt.seq, seq);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = summary(&in_a, &conv).await;
        if s.read_seq == seq && s.unread == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "region a never read y1's cursor: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "a read in region b: its receipt pushed in region a {:?} after",
        t.elapsed()
    );
    in_a.close().await;
}

/// `c`'s user's summary of `conv` in its conversation list.
async fn summary(c: &im_client::Client, conv: &str) -> im_client::proto::ConversationSummary {
    let list = c.list_conversations("", 50).await.expect("list");
    list.conversations
        .into_iter()
        .find(|s| s.conversation_id == conv)
        .expect("the conversation listed")
}

/// A server message (`POST /admin/v1/messages`) is committed only by its
/// conversation's home: refused by the other region's admin API, naming the home.
fn server_messages_at_the_home_only(regions: &Regions) {
    let names = ["a".to_owned(), "b".to_owned()];
    let user = (0..200)
        .map(|i| format!("reader{i}"))
        .find(|u| {
            let c = im_client::proto::direct_conversation("system", u);
            im_server::region::home_of(&c, &names) == Some("a")
        })
        .expect("a user whose system conversation is homed in a");
    let body = format!(r#"{{"to_user": "{user}", "kind": "system", "payload": "hello"}}"#);
    let b = &regions.region("b").nodes[1];
    let (status, answer) = b.admin_json("POST", "/admin/v1/messages", &body);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("homed in region a"), "{answer}");
    let a = &regions.region("a").nodes[1];
    let (status, answer) = a.admin_json("POST", "/admin/v1/messages", &body);
    assert_eq!(status, 200, "{answer}");
}

/// y1 (region b) edits their first message of the conversation homed in a, x2 (region
/// a) recalls theirs of the one homed in b: each is forwarded to the home, committed
/// there as an event at the next seq and replicated with its effect on the message.
async fn edit_and_recall_across(
    regions: &Regions,
    (cy1, cx2): (&im_client::Client, &im_client::Client),
    convs: &[String],
    acked: &mut Acked,
) {
    let (edited, recalled) = (acked[1].clone(), acked[2].clone());
    let e = cy1
        .edit(&edited.0, edited.1, &edited.2, "y1 0, edited")
        .await
        .expect("edit forwarded to the home a");
    let r = cx2
        .recall(&recalled.0, recalled.1, &recalled.2)
        .await
        .expect("recall forwarded to the home b");
    assert_eq!(
        (&e.conversation_id, &r.conversation_id),
        (&edited.0, &recalled.0)
    );
    acked.push((e.conversation_id, e.seq, e.msg_id));
    acked.push((r.conversation_id, r.seq, r.msg_id));
    replicated(regions, convs, acked, Duration::from_secs(30)).await;
    for name in ["a", "b"] {
        let pool = sqlx::PgPool::connect(&regions.region(name).db_url)
            .await
            .expect("region database");
        let state = |(conv, seq): (String, u64)| {
            sqlx::query_as::<_, (i32, Vec<u8>)>(
                "SELECT state, payload FROM messages WHERE conversation_id = $1 AND seq = $2",
            )
            .bind(conv)
            .bind(seq as i64)
            .fetch_one(&pool)
        };
        let got = state((edited.0.clone(), edited.1))
            .await
            .expect("edited row");
        assert_eq!(got, (1, b"y1 0, edited".to_vec()), "edited, region {name}");
        let got = state((recalled.0.clone(), recalled.1))
            .await
            .expect("recalled row");
        assert_eq!(got, (2, Vec::new()), "recalled, region {name}");
        pool.close().await;
    }
}

/// The overview of some node of each region lists the pair into it, caught up (with
/// `applied`, after applying something), and the lag gauges are exported.
async fn lag_reported(regions: &Regions, applied: bool) {
    for (to, from) in [("a", "b"), ("b", "a")] {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let found = regions.region(to).nodes.iter().any(|n| {
                let (_, body) = n.admin_get("/admin/v1/overview");
                let o: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let metrics = n.metrics();
                o["regions"].as_array().is_some_and(|r| {
                    r.iter().any(|p| {
                        p["from"] == from
                            && p["to"] == to
                            && p["lag_messages"] == 0
                            && p["lag_seconds"] == 0.0
                            && p["link_up"] == true
                            && p["applied_total"]
                                .as_u64()
                                .is_some_and(|n| n > 0 || !applied)
                    })
                }) && metric_value(&metrics, "im_region_link_up", &[("from", from), ("to", to)])
                    == 1.0
                    && metrics.contains("im_region_replication_lag_seconds{")
                    && metrics.contains("im_region_replication_lag_messages{")
            });
            if found {
                break;
            }
            assert!(Instant::now() < end, "no caught-up lag for {from} -> {to}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Within 15 s of a gateway cut, the applying node of each region reports its link
/// to the other region down: the overview pair's `link_up` false, `im_region_link_up` 0.
async fn link_down(regions: &Regions) {
    for (to, from) in [("a", "b"), ("b", "a")] {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let down = regions.region(to).nodes.iter().any(|n| {
                let (_, body) = n.admin_get("/admin/v1/overview");
                let o: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let pair = o["regions"].as_array().and_then(|r| {
                    r.iter()
                        .find(|p| p["from"] == from && p["to"] == to)
                        .cloned()
                });
                let metrics = n.metrics();
                pair.is_some_and(|p| p["link_up"] == false)
                    && metrics.contains("im_region_link_up{")
                    && metric_value(&metrics, "im_region_link_up", &[("from", from), ("to", to)])
                        == 0.0
            });
            if down {
                break;
            }
            assert!(
                Instant::now() < end,
                "{from} -> {to}: link never reported down"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Cuts the gateway for about 20 s under light load: the conversations homed where
/// their sender is keep working, a Send homed across the cut is refused with
/// REGION_UNAVAILABLE; after the heal everything replicates, nothing lost or doubled.
/// `users`: (y1, x2, x1) of the caller.
async fn cut_and_heal(
    regions: &Regions,
    clients: &[&im_client::Client; 4],
    convs: &[String],
    acked: &mut Acked,
    users: (&str, &str, &str),
) {
    let [cx1, cy1, _, cy2] = *clients;
    let (y1, x2, x1) = users;
    regions.regions.iter().for_each(|r| r.cut_gateway());
    let cut_at = Instant::now();
    let user = |u: &str| im_client::Target::User(u.to_owned());
    let (mut to_y1, mut to_x2) = (Vec::new(), Vec::new());
    let refused = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        cy1.send_text(x1, "across the cut").await
    };
    let local = async {
        let mut i = 0;
        while cut_at.elapsed() < Duration::from_secs(20) {
            // Homed in a, sent in a; homed in b, sent in b.
            let r1 = sent(cx1, user(y1), format!("cut x1 {i}")).await;
            let r2 = sent(cy2, user(x2), format!("cut y2 {i}")).await;
            to_y1.push(r1.2.clone());
            to_x2.push(r2.2.clone());
            acked.extend([r1, r2]);
            i += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (refusal, (), ()) = tokio::join!(refused, local, link_down(regions));
    refused_for_home(refusal, "a");
    let cut_for = cut_at.elapsed();
    regions.regions.iter().for_each(|r| r.heal_gateway());
    let took = replicated(regions, convs, acked, Duration::from_secs(90)).await;
    eprintln!(
        "gateway cut for {cut_for:?} under light load ({} messages committed meanwhile): \
         caught up {took:?} after the heal",
        to_y1.len() + to_x2.len()
    );
    pushed(cy1, &to_y1).await;
    pushed(clients[2], &to_x2).await;
}

/// The `q`-quantile of `v` (sorted here), or zero for none.
fn quantile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// An environment knob of the figures run, or `default`.
fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The figures of BENCHMARKS.md, "Two regions" (ignored: run it alone, with
/// `--ignored --nocapture`): two regions of two nodes, 40 ms one way on the gateway.
/// Cross-region Send -> ack against a Send homed where it is sent, the replication lag
/// (home ack -> push in the other region) at `FIG_RATE` msg/s (1000) for
/// `FIG_SECS` s (10), and the catch-up rate after a gateway cut of `FIG_CUT_SECS`
/// s (60) under `FIG_CUT_RATE` msg/s (500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures for BENCHMARKS.md; minutes long"]
async fn regions_figures() {
    let regions = Regions::start(&["a", "b"], 2, 2, DELAY, true).await;
    lag_reported(&regions, false).await;
    println!(
        "two regions of two nodes, {:?} one way on the gateway (RTT {:?})",
        DELAY,
        DELAY * 2
    );
    cross_region_acks(&regions, 300).await;
    let pairs = load_pairs(&regions, 40).await;
    let (rate, secs) = (knob("FIG_RATE", 1000), knob("FIG_SECS", 10));
    let (sent, took, mut lags) = load(&pairs, rate, Duration::from_secs(secs), true).await;
    println!(
        "replication lag (a's ack -> push in b), {sent} messages at {:.0} msg/s offered {rate}: \
         P50 {:?} P99 {:?} max {:?}",
        sent as f64 / took.as_secs_f64(),
        quantile(&mut lags, 0.5),
        quantile(&mut lags, 0.99),
        quantile(&mut lags, 1.0)
    );
    catch_up(&regions, &pairs).await;
    for (x, y) in pairs {
        x.close().await;
        y.close().await;
    }
}

/// `n` sequential Sends from region b to a conversation homed in a (forwarded, acked
/// once b applied it), then `n` to one homed in b: P50/P99 of each.
async fn cross_region_acks(regions: &Regions, n: usize) {
    let rb = regions.region("b");
    for home in ["a", "b"] {
        let (x, y) = pair_homed(&format!("ack{home}"), home);
        let cy = rb.nodes[0].client(&y).await;
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            cy.send_text(&x, format!("ack {i}"))
                .await
                .unwrap_or_else(|e| panic!("send from b homed in {home}: {e:?}"));
            took.push(t.elapsed());
        }
        println!(
            "send -> ack from region b, conversation homed in {home}, {n} sequential: \
             P50 {:?} P99 {:?}",
            quantile(&mut took, 0.5),
            quantile(&mut took, 0.99)
        );
        cy.close().await;
    }
}

/// `n` pairs of users whose conversations are homed in a: the sender connected in
/// region a, the recipient in region b (spread over both nodes of each).
async fn load_pairs(regions: &Regions, n: usize) -> Vec<(im_client::Client, im_client::Client)> {
    let (ra, rb) = (regions.region("a"), regions.region("b"));
    let mut pairs = Vec::with_capacity(n);
    for i in 0..n {
        let (x, y) = pair_homed(&format!("load{i}"), "a");
        pairs.push((
            ra.nodes[i % 2].client(&x).await,
            rb.nodes[(i + 1) % 2].client(&y).await,
        ));
    }
    pairs
}

/// Each sender sends to its recipient at `rate / pairs` msg/s for `during`; with
/// `wait`, the recipients take their pushes meanwhile, until each got every message of
/// its sender. (messages acked, the time the sends took, each message's ack -> push
/// time).
async fn load(
    pairs: &[(im_client::Client, im_client::Client)],
    rate: u64,
    during: Duration,
    wait: bool,
) -> (usize, Duration, Vec<Duration>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let per = Duration::from_secs_f64(pairs.len() as f64 / rate.max(1) as f64);
    let t0 = Instant::now();
    let expected: Vec<AtomicUsize> = pairs.iter().map(|_| AtomicUsize::new(usize::MAX)).collect();
    let senders = pairs
        .iter()
        .zip(&expected)
        .map(|((x, y), expected)| async move {
            let mut acked = std::collections::HashMap::new();
            let mut tick = tokio::time::interval(per);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while t0.elapsed() < during {
                tick.tick().await;
                let ack = x
                    .send_text(y.user_id(), "load")
                    .await
                    .unwrap_or_else(|e| panic!("{} sends: {e:?}", x.user_id()));
                acked.insert(ack.msg_id, Instant::now());
            }
            expected.store(acked.len(), Ordering::SeqCst);
            acked
        });
    let receivers = pairs
        .iter()
        .zip(&expected)
        .map(|((_, y), expected)| async move {
            let mut got = std::collections::HashMap::new();
            while wait && got.len() < expected.load(Ordering::SeqCst) {
                match y.next_message(Duration::from_secs(1)).await {
                    Ok(m) => {
                        got.insert(m.msg_id, Instant::now());
                    }
                    Err(im_client::ClientError::Timeout) => assert!(
                        t0.elapsed() < during + Duration::from_secs(300),
                        "{}: pushes missing",
                        y.user_id()
                    ),
                    Err(e) => panic!("{}: {e:?}", y.user_id()),
                }
            }
            got
        });
    let (acked, got) = tokio::join!(
        futures_util::future::join_all(senders),
        futures_util::future::join_all(receivers)
    );
    let took = t0.elapsed();
    let sent = acked.iter().map(|a| a.len()).sum();
    let mut lags = Vec::with_capacity(sent);
    for (acked, got) in acked.iter().zip(&got) {
        for (id, at) in got {
            let ack = acked
                .get(id)
                .unwrap_or_else(|| panic!("push of {id} never acked"));
            lags.push(at.saturating_duration_since(*ack));
        }
    }
    (sent, took.min(during + per), lags)
}

/// Records applied from region a into region b, over b's nodes.
fn applied_in_b(regions: &Regions) -> f64 {
    regions
        .region("b")
        .nodes
        .iter()
        .map(|n| {
            metric_value(
                &n.metrics(),
                "im_region_applied_total",
                &[("from", "a"), ("to", "b")],
            )
        })
        .sum()
}

/// The gateway cut for `FIG_CUT_SECS` while region a's users send at
/// `FIG_CUT_RATE`; after the heal, how long b takes to apply the backlog.
async fn catch_up(regions: &Regions, pairs: &[(im_client::Client, im_client::Client)]) {
    let (secs, rate) = (knob("FIG_CUT_SECS", 60), knob("FIG_CUT_RATE", 500));
    let before = applied_in_b(regions);
    regions.regions.iter().for_each(|r| r.cut_gateway());
    let (sent, _, _) = load(pairs, rate, Duration::from_secs(secs), false).await;
    let behind = applied_in_b(regions) - before;
    regions.regions.iter().for_each(|r| r.heal_gateway());
    let healed = Instant::now();
    let want = before + sent as f64;
    let mut first = None;
    loop {
        let applied = applied_in_b(regions);
        if first.is_none() && applied > before + behind {
            first = Some(healed.elapsed());
        }
        if applied >= want {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(600),
            "b applied {} of {sent} after the heal",
            applied - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = healed.elapsed();
    let first = first.unwrap_or(done);
    println!(
        "catch-up: gateway cut {secs} s while a committed {sent} messages ({behind} applied in b \
         meanwhile); after the heal: first apply {first:?}, all applied {done:?}: \
         {:.0} msg/s from the first apply",
        (sent as f64 - behind) / (done - first).as_secs_f64().max(0.001)
    );
    for (_, y) in pairs {
        while y.try_next_event().is_some() {}
    }
}

/// Waits until both regions hold the same rows for `convs`, each conversation gapless
/// from 1, every msg_id of `acked` (at its acked seq) and of `moved` (at any seq)
/// exactly once in each; panics after `limit`.
async fn same_in_both(
    regions: &Regions,
    convs: &[String],
    acked: &Acked,
    moved: &[String],
    limit: Duration,
) {
    let t0 = Instant::now();
    loop {
        replicated_rows_once(regions, convs, acked, moved).await;
        let of = |rows: Vec<(String, i64, String)>| -> Vec<(String, i64, String)> {
            rows.into_iter().filter(|r| convs.contains(&r.0)).collect()
        };
        let (a, b) = (
            of(stored(regions, "a").await),
            of(stored(regions, "b").await),
        );
        let once = |rows: &[(String, i64, String)], m: &String| {
            rows.iter().filter(|r| &r.2 == m).count() == 1
        };
        let complete = acked.iter().all(|(c, s, m)| {
            [&a, &b]
                .iter()
                .all(|rows| rows.contains(&(c.clone(), *s as i64, m.clone())) && once(rows, m))
        }) && moved.iter().all(|m| once(&a, m) && once(&b, m));
        if complete && a == b {
            for conv in convs {
                let seqs: Vec<i64> = a.iter().filter(|r| &r.0 == conv).map(|r| r.1).collect();
                assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "{conv}");
            }
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "not the same within {limit:?}: a {a:?}\nb {b:?}\nacked {acked:?}\nmoved {moved:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// No msg_id is stored twice in either region, whenever it is looked at.
async fn replicated_rows_once(regions: &Regions, convs: &[String], _: &Acked, _: &[String]) {
    for name in ["a", "b"] {
        let rows = stored(regions, name).await;
        let mut ids: Vec<&String> = rows
            .iter()
            .filter(|r| convs.contains(&r.0))
            .map(|r| &r.2)
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            n,
            "region {name} stores a msg_id twice: {rows:?}"
        );
    }
}

/// The sum of `name` over the nodes of region `region`.
fn region_metric(regions: &Regions, region: &str, name: &str) -> f64 {
    regions
        .region(region)
        .nodes
        .iter()
        .map(|n| metric_value(&n.metrics(), name, &[]))
        .sum()
}

/// Waits (5 s at most) until `node` sees the conversation of `path` homed in `home`
/// at `epoch`; its answer.
fn learnt(
    node: &crate::support::TestServer,
    path: &str,
    home: &str,
    epoch: u64,
) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, body) = node.admin_get(path);
        let h: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if h["home"] == home && h["epoch"] == epoch {
            return h;
        }
        assert!(
            Instant::now() < end,
            "the node did not learn the move: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_home_move_fences_a_killed_region_and_reconciles_when_it_returns() {
    if !crate::support::nats::nats_server_available() {
        return;
    }
    let t0 = Instant::now();
    let mut regions = Regions::start(&["a", "b"], 2, 2, DELAY, true).await;
    lag_reported(&regions, false).await;
    // Two one-to-one conversations homed in a: x (region a) with y (region b).
    let ((x, y), (x2, y2)) = (pair_homed("h", "a"), pair_homed("k", "a"));
    let convs = vec![
        im_client::proto::direct_conversation(&x, &y),
        im_client::proto::direct_conversation(&x2, &y2),
    ];
    let (ra, rb) = (regions.region("a"), regions.region("b"));
    let (cx, cx2) = (ra.nodes[0].client(&x).await, ra.nodes[1].client(&x2).await);
    let (cy, cy2) = (rb.nodes[1].client(&y).await, rb.nodes[0].client(&y2).await);
    let user = |u: &str| im_client::Target::User(u.to_owned());
    let mut acked: Acked = Vec::new();
    for i in 0..3 {
        acked.push(sent(&cx, user(&y), format!("x {i}")).await);
        acked.push(sent(&cy, user(&x), format!("y {i}")).await);
        acked.push(sent(&cx2, user(&y2), format!("x2 {i}")).await);
    }
    replicated(&regions, &convs, &acked, Duration::from_secs(30)).await;
    // The link is cut: a acks messages of its home that b never gets, then a dies
    // whole (nodes and NATS).
    ra.cut_gateway();
    rb.cut_gateway();
    let mut unreplicated = Vec::new();
    for i in 0..4 {
        unreplicated.push(sent(&cx, user(&y), format!("unreplicated x {i}")).await.2);
    }
    unreplicated.push(sent(&cx2, user(&y2), "unreplicated x2".into()).await.2);
    // a's publisher puts them in a's own stream (b fences them when a returns).
    tokio::time::sleep(Duration::from_secs(1)).await;
    regions.region_mut("a").kill();
    regions.region("b").heal_gateway();
    for c in [cx, cx2] {
        c.close().await;
    }
    let rb = regions.region("b");
    let path = format!("/admin/v1/homes/{}", convs[0]);
    let (status, body) = rb.nodes[0].admin_json("POST", &path, r#"{"region":"b"}"#);
    assert_eq!(status, 409, "not forced, a lost: {body}");
    assert!(body.contains("region a"), "{body}");
    let (status, body) = rb.nodes[0].admin_json("POST", &path, r#"{"region":"a","force":true}"#);
    assert_eq!(status, 400, "a move is made at the new home: {body}");
    let (status, body) = rb.nodes[0].admin_json(
        "POST",
        "/admin/v1/homes",
        r#"{"from":"a","to":"b","force":true}"#,
    );
    assert_eq!(status, 200, "{body}");
    let moved: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (moved["moved"].as_u64(), moved["failed"].as_u64()),
        (Some(2), Some(0)),
        "{body}"
    );
    let fence = 6;
    let h = learnt(&rb.nodes[1], &path, "b", 1);
    assert_eq!(h["fence"], fence, "{h}");
    let (_, body) = rb.nodes[0].admin_get("/admin/v1/overview");
    let o: serde_json::Value = serde_json::from_str(&body).expect("overview");
    assert_eq!(o["homes_moved"], 2, "the overview counts the moved homes");
    // Sends in b now go to b, from the fence on.
    let first = sent(&cy, user(&x), "after the move y 0".into()).await;
    assert_eq!(
        first.1,
        fence + 1,
        "the new home assigns seqs from the fence on"
    );
    acked.push(first);
    for i in 1..3 {
        acked.push(sent(&cy, user(&x), format!("after the move y {i}")).await);
        acked.push(sent(&cy2, user(&x2), format!("after the move y2 {i}")).await);
    }
    // a comes back: it reads b's stream (the move) before it serves its homes, sets
    // aside what it acked above the fence and re-sends it to b, and forwards its
    // clients' Sends of the moved conversations to b.
    let revived = Instant::now();
    regions.revive("a").await;
    eprintln!("region a back and serving after {:?}", revived.elapsed());
    let cx = regions.region("a").nodes[0].client(&x).await;
    let back = sent(&cx, user(&y), "after the return x".into()).await;
    assert!(back.1 > fence + 2, "a forwards to the new home: {back:?}");
    acked.push(back);
    same_in_both(
        &regions,
        &convs,
        &acked,
        &unreplicated,
        Duration::from_secs(40),
    )
    .await;
    // Each set-aside message counted once at a; b dropped a's copies above the fence.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let reconciled = region_metric(&regions, "a", "im_region_reconciled_total");
        let fenced = region_metric(&regions, "b", "im_region_fenced_total");
        assert!(reconciled <= 5.0, "reconciled {reconciled}");
        if reconciled == 5.0 && fenced == 5.0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "reconciled {reconciled}, fenced {fenced}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        regions
            .region("a")
            .nodes
            .iter()
            .any(|n| n.log().contains("reconciled")),
        "a WARN names each reconciled message"
    );
    // y (in b) gets the reconciled messages pushed, once committed at b.
    pushed(&cy, &unreplicated[..4]).await;
    // A planned move back to a, confirmed by b (no force): b stops at its seq, the fence.
    let ra = regions.region("a");
    let (status, body) = ra.nodes[0].admin_json("POST", &path, r#"{"region":"a"}"#);
    assert_eq!(status, 200, "{body}");
    let h: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (
            h["home"].as_str(),
            h["epoch"].as_u64(),
            h["set_aside"].as_u64()
        ),
        (Some("a"), Some(2), Some(0)),
        "{body}"
    );
    let fence2 = h["fence"].as_u64().expect("fence");
    // Every node learns it within a poll (500 ms); until then a forwarded Send may be
    // refused REGION_UNAVAILABLE, and retried.
    for name in ["a", "b"] {
        for n in &regions.region(name).nodes {
            learnt(n, &path, "a", 2);
        }
    }
    let home_again = sent(&cx, user(&y), "home again x".into()).await;
    assert_eq!(home_again.1, fence2 + 1, "a assigns seqs from b's fence on");
    acked.push(home_again);
    acked.push(sent(&cy, user(&x), "home again y".into()).await);
    same_in_both(
        &regions,
        &convs,
        &acked,
        &unreplicated,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        region_metric(&regions, "a", "im_region_reconciled_total"),
        5.0
    );
    assert_eq!(
        region_metric(&regions, "b", "im_region_reconciled_total"),
        0.0
    );
    for c in [cx, cy, cy2] {
        c.close().await;
    }
    eprintln!("home move test took {:?}", t0.elapsed());
}
