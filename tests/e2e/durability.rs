//! Durability: a SendAck means committed. Kill the server with SIGKILL while 1,000
//! messages are in flight; after a restart every acked message is stored and syncs.

use std::collections::HashMap;
use std::time::Duration;

use im_client::proto::Body;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_1000_in_flight_loses_no_acked_message() {
    // Small batches make many commits, so the kill lands between them.
    let mut server = TestServer::start_with(&[
        ("IM_PERSIST_BATCH_MAX", "8"),
        ("IM_PERSIST_BATCH_WAIT_MS", "0"),
    ]);
    let acked_so_far = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    const SENDERS: usize = 4;
    const EACH: usize = 250;
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let mut c = server.raw(&format!("sender{s}")).await;
        let counter = acked_so_far.clone();
        tasks.push(tokio::spawn(async move {
            // Pipeline all 250 sends, then collect acks until the connection dies.
            for i in 0..EACH {
                let id = format!("s{s}-{i}");
                if c.send(&send_to_user(i as u64 + 1, "sink", id.as_bytes(), &id))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let mut acked = Vec::new();
            while let Ok(im_client::RawEvent::Frame(f)) = c.recv_timeout(WAIT).await {
                if let Some(Body::SendAck(a)) = f.body {
                    acked.push(a);
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            acked
        }));
    }
    // Let some commits land, then kill mid-flight.
    let deadline = std::time::Instant::now() + WAIT;
    while acked_so_far.load(std::sync::atomic::Ordering::Relaxed) < 100 {
        assert!(std::time::Instant::now() < deadline, "no acks arrived");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.kill();
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert!(
        acked.len() < SENDERS * EACH,
        "all {} messages were acked before the kill; the test did not catch any in flight",
        acked.len()
    );

    server.restart();
    let mut sink = server.raw("sink").await;
    let stored = raw_sync_all(&mut sink, 500).await;
    let by_conv_seq: HashMap<(String, u64), &im_client::proto::ChatMessage> = stored
        .iter()
        .map(|m| ((m.conversation_id.clone(), m.seq), m))
        .collect();
    for a in &acked {
        let m = by_conv_seq
            .get(&(a.conversation_id.clone(), a.seq))
            .unwrap_or_else(|| panic!("acked message {a:?} is missing after restart"));
        assert_eq!(m.msg_id, a.msg_id);
        assert_eq!(m.client_msg_id, a.client_msg_id);
    }
    // Seqs stay gapless per conversation, and nothing is stored twice.
    let mut per_conv: HashMap<&str, Vec<u64>> = HashMap::new();
    for m in &stored {
        per_conv.entry(&m.conversation_id).or_default().push(m.seq);
    }
    for (conv, seqs) in per_conv {
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{conv}");
    }
    let mut ids: Vec<&str> = stored.iter().map(|m| m.client_msg_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), stored.len(), "a message is stored twice");
    eprintln!(
        "acked before SIGKILL: {} of {}; stored: {}",
        acked.len(),
        SENDERS * EACH,
        stored.len()
    );
}
