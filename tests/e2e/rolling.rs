//! A rolling upgrade under steady chat: the three nodes of a cluster (Postgres + NATS)
//! are restarted one by one, each drained with SIGTERM (it must exit cleanly within its
//! drain timeout), started again on the same port and awaited until every node sees the
//! cluster whole, while senders on one node keep sending to receivers on the next.
//! Afterwards: nothing acked is lost or stored twice, every conversation's seqs run from
//! 1 without a gap, traffic went on after each restart, and no client saw more than one
//! reconnect (its own node's restart).

use std::collections::HashMap;
use std::time::Duration;

use crate::support::cluster::TestCluster;
use crate::support::faults::{assert_stored_once, Pair, Traffic};
use crate::support::*;

const PAIRS: usize = 6;

#[tokio::test]
async fn restarting_every_node_in_turn_loses_nothing_acked() {
    let mut cluster = TestCluster::start(3, &[("IM_FLOW_DRAIN_TIMEOUT_SECS", "5")]).await;
    let pairs: Vec<Pair> = (0..PAIRS)
        .map(|i| Pair {
            sender: format!("rs{i}"),
            receiver: format!("rr{i}"),
            sender_url: cluster.nodes[i % 3].ws_url(),
            receiver_url: cluster.nodes[(i + 1) % 3].ws_url(),
        })
        .collect();
    let token_node = &cluster.nodes[0];
    let tokens: HashMap<String, String> = pairs
        .iter()
        .flat_map(|p| [p.sender.clone(), p.receiver.clone()])
        .map(|u| (u.clone(), token_node.token(&u)))
        .collect();
    let traffic = Traffic::start(&pairs, |u| tokens[u].clone(), 20);
    traffic.wait_acks(PAIRS * 10, Duration::from_secs(20)).await;

    for i in 0..3 {
        cluster.nodes[i].sigterm();
        let status = cluster.nodes[i]
            .wait_exit(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("node {i} did not exit within 15 s of SIGTERM"));
        assert!(status.success(), "node {i} exited {status:?} after SIGTERM");
        cluster.nodes[i].restart();
        for j in 0..3 {
            cluster
                .wait_for(
                    j,
                    &format!("node {j} to see 3 healthy nodes after restarting node {i}"),
                    |o| o["cluster"]["summary"]["healthy"] == 3,
                )
                .await;
        }
        // The restarted node takes sends and pushes again before the next one goes.
        traffic.wait_acks(PAIRS * 10, Duration::from_secs(30)).await;
    }

    let out = traffic.stop(Duration::from_secs(2)).await;
    assert!(
        out.refused.is_empty(),
        "sends refused for good: {:?}",
        out.refused
    );
    assert!(
        out.acked.len() >= PAIRS * 40,
        "only {} acks",
        out.acked.len()
    );
    // Each client's node restarted once: it saw exactly that one reconnect.
    for user in tokens.keys() {
        let n = out.reconnects_by_user.get(user).copied().unwrap_or(0);
        assert_eq!(
            n, 1,
            "{user} reconnected {n} times during the rolling restart"
        );
    }

    // Every acked message is stored once, at its acked seq, and seqs have no gap.
    let mut synced = Vec::new();
    for p in &pairs {
        let mut c = cluster.nodes[0].raw(&p.receiver).await;
        synced.extend(chat_only(raw_sync_all(&mut c, 1000).await));
    }
    assert_stored_once(&out.acked, &synced);
    let mut seqs: HashMap<&str, Vec<u64>> = HashMap::new();
    for m in &synced {
        seqs.entry(m.conversation_id.as_str())
            .or_default()
            .push(m.seq);
    }
    for (conv, s) in &mut seqs {
        s.sort_unstable();
        let want: Vec<u64> = (1..=s.len() as u64).collect();
        assert_eq!(s, &want, "{conv} has a gap or a repeat");
    }
    eprintln!(
        "rolling restart: {} acked, {} retried, {} reconnects",
        out.acked.len(),
        out.retried,
        out.reconnects
    );
    cluster.cleanup().await;
}
