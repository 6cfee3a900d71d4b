//! Cluster faults: three real nodes on the shared Postgres (a schema per run) and the
//! test's own nats-server, with users on different nodes sending one-to-one to each
//! other steadily while the fault happens:
//! - NATS SIGKILLed and started again on the same port (its memory buckets are gone);
//! - one node SIGKILLed (its clients fail over through `/v1/route`);
//! - one node SIGSTOPped for a few seconds, then SIGCONTed.
//!
//! Each case checks: every acked message is stored once at its acked seq; every online
//! receiver gets every acked message (push or sync) once the fault heals, with no new
//! traffic to prompt it; `/readyz` tells the truth during and after; the cluster heals
//! without restarting a node, within [`RECOVERY`].
//!
//! Sized for CI (6 users, a fault of 3 to 5 s); `IM_FAULT_USERS` and `IM_FAULT_SECS`
//! make them bigger for the figures in BENCHMARKS.md, which each case prints.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use im_client::proto::{direct_conversation, MessageType};
use im_client::{Client, ClientConfig, Target};

use crate::support::cluster::{collect, missing, received_all, Inbox, TestCluster};
use crate::support::nats::PrivateNats;
use crate::support::{self, env_u64, eventually};

/// How long the cluster may take to heal once the fault is over.
const RECOVERY: Duration = Duration::from_secs(30);

/// Users sending (one per sender; `IM_FAULT_USERS`, default 6).
fn users() -> usize {
    env_u64("IM_FAULT_USERS", 6) as usize
}

/// How long a fault lasts (`IM_FAULT_SECS`, else `default`).
fn fault_for(default: Duration) -> Duration {
    Duration::from_secs(env_u64("IM_FAULT_SECS", default.as_secs()))
}

/// One SendAck: (conversation, seq, msg_id) and the receiver's index.
type Acked = (String, u64, String, usize);

/// Users `u0..u<n>` each send to `partner(i)` every 20 ms until `stop`, with stable
/// client msg ids (a resend after a failover is deduplicated); returns every ack.
struct Senders {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Acked>>>,
}

impl Senders {
    fn start(clients: &[Arc<Client>], partner: fn(usize, usize) -> usize) -> Senders {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let n = clients.len();
        let tasks = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                let (client, stop, sent) = (client.clone(), stop.clone(), sent.clone());
                let to = partner(i, n);
                tokio::spawn(async move {
                    let to_user = format!("u{to}");
                    let conv = direct_conversation(client.user_id(), &to_user);
                    let mut acked = Vec::new();
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let ack = client
                            .send(
                                Target::User(to_user.clone()),
                                MessageType::Text,
                                format!("{k}"),
                                Some(format!("{}-{k}", client.user_id())),
                            )
                            .await
                            .expect("send (retried through the fault)");
                        acked.push((conv.clone(), ack.seq, ack.msg_id, to));
                        sent.fetch_add(1, Ordering::Relaxed);
                        k += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    acked
                })
            })
            .collect();
        Senders { stop, sent, tasks }
    }

    /// Waits until `n` more sends are acked.
    async fn wait_more(&self, n: u64) {
        let target = self.sent.load(Ordering::Relaxed) + n;
        eventually("more sends to be acked", || {
            self.sent.load(Ordering::Relaxed) >= target
        })
        .await;
    }

    /// Tells the senders to stop after the send each has in flight.
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the senders; returns every ack.
    async fn finish(self) -> Vec<Acked> {
        self.stop();
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("sender task"));
        }
        all
    }
}

/// Waits (up to [`RECOVERY`]) until every receiver's inbox holds every message acked to
/// it; then checks nothing arrived twice and each conversation came in seq order.
/// Returns when the last one had arrived.
async fn check_delivered(acked: &[Acked], inboxes: &[Inbox]) -> Instant {
    let mut want: Vec<HashMap<String, HashSet<String>>> = vec![HashMap::new(); inboxes.len()];
    for (conv, _, id, to) in acked {
        want[*to]
            .entry(conv.clone())
            .or_default()
            .insert(id.clone());
    }
    let end = Instant::now() + RECOVERY;
    for (i, inbox) in inboxes.iter().enumerate() {
        while !received_all(inbox, &want[i]) {
            if Instant::now() > end {
                panic!(
                    "u{i} is missing {} acked messages {RECOVERY:?} after the fault healed",
                    missing(inbox, &want[i])
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let all_in = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, inbox) in inboxes.iter().enumerate() {
        let mut seen = HashSet::new();
        let mut last: HashMap<String, u64> = HashMap::new();
        for m in inbox.lock().unwrap().iter() {
            assert!(seen.insert(m.msg_id.clone()), "u{i} got {} twice", m.msg_id);
            let prev = last.insert(m.conversation_id.clone(), m.seq).unwrap_or(0);
            assert!(m.seq > prev, "u{i}: seq {} after {prev}", m.seq);
        }
    }
    all_in
}

/// The store check of [`TestCluster::check_stored`] for these acks.
async fn check_stored(c: &TestCluster, acked: &[Acked]) {
    let acks: Vec<(String, u64, String)> = acked
        .iter()
        .map(|(conv, seq, id, _)| (conv.clone(), *seq, id.clone()))
        .collect();
    let stored = c.check_stored(&acks).await;
    assert_eq!(stored, acks.len(), "every send stored once");
}

/// `/readyz` of node `i` until it answers `status`; returns the body.
async fn wait_readyz(c: &TestCluster, i: usize, status: u16, within: Duration) -> String {
    let end = Instant::now() + within;
    loop {
        let (s, body) = c.readyz(i);
        if s == status {
            return body;
        }
        assert!(
            Instant::now() < end,
            "n{i} /readyz stayed {s} {body}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SDK clients `u0..u<n>`, `u<i>` connected straight to node `i % 3` (no route URLs,
/// so a reconnect returns to the same node).
async fn pinned_clients(c: &TestCluster, n: usize) -> (Vec<Arc<Client>>, Vec<Inbox>) {
    let mut clients = Vec::new();
    let mut inboxes = Vec::new();
    for i in 0..n {
        let node = &c.nodes[i % c.nodes.len()];
        let mut cfg = ClientConfig::new(node.ws_url(), node.token(&format!("u{i}")));
        cfg.reconnect_max = Duration::from_millis(500);
        let client = Arc::new(Client::connect(cfg).await.expect("connect"));
        inboxes.push(collect(client.clone()));
        clients.push(client);
    }
    (clients, inboxes)
}

/// The next user, which with users spread round-robin is on another node.
fn next(i: usize, n: usize) -> usize {
    (i + 1) % n
}

fn metric_sum(c: &TestCluster, nodes: &[usize], name: &str) -> f64 {
    nodes.iter().map(|&i| c.nodes[i].metric(name, &[])).sum()
}

#[test]
fn nats_killed_and_restarted_cluster_heals_and_delivers_every_ack() {
    let _x = support::faults::exclusive_blocking();
    support::faults::runtime().block_on(nats_kill_case());
}

async fn nats_kill_case() {
    let mut nats = PrivateNats::start();
    let c = TestCluster::start_on(3, &nats.url(), &[]).await;
    let n = users();
    let (clients, inboxes) = pinned_clients(&c, n).await;
    c.wait_presence(&[0, 1, 2], n as u64).await;

    let senders = Senders::start(&clients, next);
    senders.wait_more(30).await;
    nats.kill();
    let cut = Instant::now();
    // Cut from NATS: every node says so, and keeps acking (the store is fine).
    for i in 0..3 {
        let body = wait_readyz(&c, i, 503, support::WAIT).await;
        assert!(body.contains("not ready: cluster"), "n{i}: {body}");
    }
    senders.wait_more(60).await;
    // At least the registry TTL: every report in the memory buckets is gone anyway.
    tokio::time::sleep(fault_for(c.ttl).saturating_sub(cut.elapsed())).await;
    // No new traffic once NATS is back: what was acked while the link was down must
    // reach the receivers by the resync after the reconnect, not by a later push that
    // shows the SDK a gap.
    let acked = senders.finish().await;
    nats.restart();
    let healed = Instant::now();
    // Ready again without a restart: the nodes reconnect and resync on their own.
    for i in 0..3 {
        wait_readyz(&c, i, 200, RECOVERY).await;
    }
    let ready = healed.elapsed();
    let all_in = check_delivered(&acked, &inboxes).await;
    eprintln!(
        "NATS outage of {:?}: {} acked by {n} senders; every node ready {ready:?} after \
         NATS came back; all delivered {:?} after it",
        healed - cut,
        acked.len(),
        all_in - healed
    );
    check_stored(&c, &acked).await;

    // Cross-node pushes work again: a raw session on n0 gets a message sent on n1.
    let known = c.overview(1)["cluster"]["users_on_other_nodes"]
        .as_u64()
        .unwrap_or(0);
    let mut watcher = c.nodes[0].raw("w0").await;
    c.wait_for(1, "n1 to see w0 on n0", |o| {
        o["cluster"]["users_on_other_nodes"].as_u64() > Some(known)
    })
    .await;
    let mut w = Vec::new();
    clients[1]
        .send(Target::User("w0".into()), MessageType::Text, "after", None)
        .await
        .expect("send after the heal");
    while w.is_empty() {
        let f = support::next_frame(&mut watcher).await;
        if let Some(im_client::proto::Body::Deliver(d)) = f.body {
            w.extend(d.messages);
        }
    }
    assert_eq!(w[0].payload.as_ref(), b"after");

    // What the operator sees: the link is up, it counted the reconnect and rebuilt the
    // buckets.
    let all = [0, 1, 2];
    for i in all {
        assert_eq!(c.nodes[i].metric("im_cluster_link_up", &[]), 1.0, "n{i}");
        assert!(c.nodes[i].metric("im_cluster_reconnects_total", &[]) >= 1.0);
    }
    assert!(metric_sum(&c, &all, "im_cluster_kv_recreated_total") >= 2.0);
    c.cleanup().await;
}

/// Asks each node of `ask` for a route `rounds` times, avoiding every node but `node`
/// (so the answer is `node` whenever it is routable, else the asked node itself);
/// whether any answer named `node`.
fn offered(c: &TestCluster, ask: &[usize], node: &str, rounds: usize) -> bool {
    let avoid: Vec<String> = (0..c.nodes.len())
        .map(|i| format!("n{i}"))
        .filter(|n| n != node)
        .collect();
    let avoid = avoid.join(",");
    (0..rounds).any(|_| {
        ask.iter()
            .any(|&i| c.route(i, &avoid).as_deref() == Some(node))
    })
}

/// Waits until `ask` stop offering `node`; returns how long that took.
async fn wait_out_of_rotation(c: &TestCluster, ask: &[usize], node: &str) -> Duration {
    let t = Instant::now();
    while offered(c, ask, node, 1) {
        assert!(
            t.elapsed() < support::WAIT,
            "{node} still offered by /v1/route"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

#[test]
fn node_killed_leaves_routing_before_the_ttl_and_its_clients_get_everything() {
    let _x = support::faults::exclusive_blocking();
    support::faults::runtime().block_on(node_kill_case());
}

async fn node_kill_case() {
    let nats = PrivateNats::start();
    let mut c = TestCluster::start_on(3, &nats.url(), &[]).await;
    let mut clients = Vec::new();
    let mut inboxes = Vec::new();
    let n = users();
    for i in 0..n {
        let client = Arc::new(c.routed_client(&format!("u{i}")).await);
        inboxes.push(collect(client.clone()));
        clients.push(client);
    }
    c.wait_presence(&[0, 1, 2], n as u64).await;
    let victim = c.index_of(&clients[0].node_id());
    let dead = format!("n{victim}");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let moved = clients.iter().filter(|cl| cl.node_id() == dead).count();

    let senders = Senders::start(&clients, next);
    senders.wait_more(30).await;
    c.nodes[victim].kill();
    let killed = Instant::now();
    // Out of /v1/route well before the registry TTL, and it stays out; meanwhile the
    // dead node's clients log in elsewhere (each timed on its own).
    let (mut out, mut relogged) = (None, None);
    while out.is_none() || relogged.is_none() {
        assert!(
            killed.elapsed() < support::WAIT,
            "out {out:?}, relogged {relogged:?}"
        );
        if out.is_none() && !offered(&c, &survivors, &dead, 1) {
            out = Some(killed.elapsed());
        }
        if relogged.is_none() && clients.iter().all(|cl| cl.node_id() != dead) {
            relogged = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (out, relogged) = (out.unwrap_or_default(), relogged.unwrap_or_default());
    assert!(out < c.ttl, "{dead} offered for {out:?} (ttl {:?})", c.ttl);
    assert!(!offered(&c, &survivors, &dead, 10));
    // The survivors are ready all along.
    for &i in &survivors {
        assert_eq!(c.readyz(i).0, 200, "n{i}");
    }
    senders.wait_more(30).await;
    let acked = senders.finish().await;
    check_delivered(&acked, &inboxes).await;
    check_stored(&c, &acked).await;

    // What the operator sees: each survivor logged and counted the loss.
    for &i in &survivors {
        assert_eq!(c.readyz(i).0, 200, "n{i}");
        eventually(&format!("n{i} to count and log the loss"), || {
            c.nodes[i].metric("im_cluster_nodes_lost_total", &[]) >= 1.0
                && c.nodes[i].log().contains("cluster node lost")
        })
        .await;
        let o = c.overview(i);
        assert_eq!(o["cluster"]["summary"]["healthy"], 2, "{o}");
    }
    // New clients only go to the survivors.
    for k in 0..6 {
        let cl = c.routed_client(&format!("new{k}")).await;
        assert_ne!(cl.node_id(), dead);
    }
    eprintln!(
        "node SIGKILL: {} acked by {n} senders ({moved} clients); out of /v1/route after \
         {out:?}; its clients re-logged in elsewhere after {relogged:?}",
        acked.len()
    );
    c.cleanup().await;
}

#[test]
fn node_stopped_then_continued_is_routed_around_and_catches_up() {
    let _x = support::faults::exclusive_blocking();
    support::faults::runtime().block_on(node_stop_case());
}

async fn node_stop_case() {
    let nats = PrivateNats::start();
    let c = TestCluster::start_on(3, &nats.url(), &[]).await;
    let n = users();
    let (clients, inboxes) = pinned_clients(&c, n).await;
    c.wait_presence(&[0, 1, 2], n as u64).await;
    let victim = 2;
    let name = format!("n{victim}");
    let survivors = [0, 1];

    let senders = Senders::start(&clients, next);
    senders.wait_more(30).await;
    c.nodes[victim].signal("STOP");
    let stopped = Instant::now();
    // The others route around it and stay ready; their users go on chatting.
    let out = wait_out_of_rotation(&c, &survivors, &name).await;
    for i in survivors {
        assert_eq!(c.readyz(i).0, 200, "n{i}");
    }
    senders.wait_more(30).await;
    let stop_for = fault_for(Duration::from_secs(5));
    tokio::time::sleep(stop_for.saturating_sub(stopped.elapsed())).await;
    // Only the stopped node's senders (their sends in flight) finish after it resumes:
    // nothing new is pushed to its users, so what they missed must come by the resync
    // the others send it when it is back.
    senders.stop();
    c.nodes[victim].signal("CONT");
    let resumed = Instant::now();
    let acked = senders.finish().await;

    // Back: ready, offered again, and its users get what they missed.
    wait_readyz(&c, victim, 200, RECOVERY).await;
    let end = Instant::now() + RECOVERY;
    while !offered(&c, &survivors, &name, 1) {
        assert!(Instant::now() < end, "{name} not offered again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back_in = resumed.elapsed();
    let delivered = check_delivered(&acked, &inboxes).await - resumed;
    check_stored(&c, &acked).await;
    for i in survivors {
        eventually(
            &format!("n{i} to count and log the loss and the return"),
            || {
                let log = c.nodes[i].log();
                c.nodes[i].metric("im_cluster_nodes_lost_total", &[]) >= 1.0
                    && c.nodes[i].metric("im_cluster_nodes_returned_total", &[]) >= 1.0
                    && log.contains("cluster node lost")
                    && log.contains("cluster node back")
            },
        )
        .await;
    }
    eprintln!(
        "node SIGSTOP {stop_for:?}: {} acked by {n} senders; out of /v1/route after \
         {out:?}; back in {back_in:?} after SIGCONT; all delivered {:?} after SIGCONT",
        acked.len(),
        delivered
    );
    c.cleanup().await;
}
