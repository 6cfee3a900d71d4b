//! Offline storage, sync and resume.

use im_client::proto::{frame, Body, DeliverAck};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_user_syncs_everything_on_reconnect() {
    let server = TestServer::start();
    let mut alice = server.raw("alice").await;
    let mut carol = server.raw("carol").await;
    for i in 0..30u64 {
        alice
            .send(&send_to_user(
                i + 10,
                "bob",
                format!("a{i}").as_bytes(),
                &format!("a{i}"),
            ))
            .await
            .unwrap();
    }
    for i in 0..5u64 {
        carol
            .send(&send_to_user(
                i + 10,
                "bob",
                format!("c{i}").as_bytes(),
                &format!("c{i}"),
            ))
            .await
            .unwrap();
    }
    assert_eq!(acks(&mut alice, 30).await.len(), 30);
    assert_eq!(acks(&mut carol, 5).await.len(), 5);

    // Bob comes online and pages through everything, 7 at a time.
    let mut bob = server.raw("bob").await;
    let all = raw_sync_all(&mut bob, 7).await;
    assert_eq!(all.len(), 35, "{all:?}");
    let from_alice: Vec<u64> = all
        .iter()
        .filter(|m| m.conversation_id == "u:alice:bob")
        .map(|m| m.seq)
        .collect();
    let from_carol: Vec<u64> = all
        .iter()
        .filter(|m| m.conversation_id == "u:bob:carol")
        .map(|m| m.seq)
        .collect();
    assert_eq!(from_alice, (1..=30).collect::<Vec<_>>());
    assert_eq!(from_carol, (1..=5).collect::<Vec<_>>());
    // Ordered by (conversation_id, seq).
    let keys: Vec<(String, u64)> = all
        .iter()
        .map(|m| (m.conversation_id.clone(), m.seq))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);

    // Bob acks alice's conversation up to 20 and carol's fully, then reconnects.
    for (conv, seq) in [("u:alice:bob", 20), ("u:bob:carol", 5)] {
        bob.send(&frame(
            0,
            Body::DeliverAck(DeliverAck {
                conversation_id: conv.into(),
                seq,
            }),
        ))
        .await
        .unwrap();
    }
    // A cursor is committed by the writer: once both are stored, resume on a new socket.
    server.wait_cursor("bob", "u:alice:bob", 20).await;
    server.wait_cursor("bob", "u:bob:carol", 5).await;
    drop(bob);
    let mut bob = server.raw("bob").await;
    let rest = raw_sync_all(&mut bob, 100).await;
    let seqs: Vec<(String, u64)> = rest
        .iter()
        .map(|m| (m.conversation_id.clone(), m.seq))
        .collect();
    let expected: Vec<(String, u64)> = (21..=30).map(|s| ("u:alice:bob".to_owned(), s)).collect();
    assert_eq!(seqs, expected, "nothing lost, nothing twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_client_resumes_after_server_restart() {
    let mut server = TestServer::start();
    let bob = server.client("bob").await;
    let alice = server.client("alice").await;
    alice.send_text("bob", "before").await.unwrap();
    let m = bob.next_message(WAIT).await.unwrap();
    assert_eq!(&m.payload[..], b"before");
    drop(alice);

    // The node dies; while bob is away, alice (on a fresh connection) sends more.
    server.restart();
    let alice = server.client("alice").await;
    for i in 0..5 {
        alice
            .send_text("bob", &format!("while away {i}"))
            .await
            .unwrap();
    }
    // Bob's SDK reconnects by itself, syncs, and sees each missed message exactly once.
    let mut got = Vec::new();
    while got.len() < 5 {
        let m = bob.next_message(WAIT).await.expect("bob resumes");
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(
        got,
        (0..5)
            .map(|i| format!("while away {i}"))
            .collect::<Vec<_>>()
    );
    assert!(bob
        .next_message(std::time::Duration::from_millis(500))
        .await
        .is_err());
}
