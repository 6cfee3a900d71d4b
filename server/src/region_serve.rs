//! Multi-region, the home's side of forwarding: this region's nodes take the Sends,
//! GroupOps, Recalls and Edits other regions forward (a NATS queue group on `region::send_subject`, one
//! node answers each) and run each through the ordinary pipeline as its sender, on a
//! connection-less session whose queue receives the reply; the answer (the SendAck or
//! GroupOpOk, queued only after the durable commit, or the Error) goes back as the
//! request's reply. It lives apart from
//! `region` because it calls the pipeline, which calls `region`.

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use im_proto::{Body, Frame, Message as _};

use crate::config::Config;
use crate::flow::Outbound;
use crate::pipeline::{Pipeline, Session};
use crate::region::{parse_forwarded, send_subject, RegionMap, FORWARD_TIMEOUT};

/// Most forwarded Sends handled at once on this node (the rest wait in NATS).
const MAX_IN_FLIGHT: usize = 1024;

/// Takes forwarded Sends for this region until the subscription ends.
pub async fn run(
    client: async_nats::Client,
    map: Arc<RegionMap>,
    pipeline: Arc<Pipeline>,
    config: Arc<Config>,
) {
    let subject = send_subject(&map.local);
    let mut sub = match client
        .queue_subscribe(subject.clone(), "im-region-send".into())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(%subject, error = %e, "cannot take forwarded sends");
            return;
        }
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let sig = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(crate::region::SIG_HEADER))
            .map(|v| v.as_str());
        if !map.verify(&msg.payload, sig) {
            tracing::warn!(
                bytes = msg.payload.len(),
                "forwarded send without a valid cluster.key signature dropped"
            );
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (client, map, pipeline, config) = (
            client.clone(),
            map.clone(),
            pipeline.clone(),
            config.clone(),
        );
        tokio::spawn(async move {
            if let Some(answer) = answer(&map, &pipeline, &config, &msg.payload).await {
                let _ = client.publish(reply, answer).await;
            }
            drop(permit);
        });
    }
}

/// The encoded answer to one forwarded request (`None`: malformed, not answered).
async fn answer(
    map: &RegionMap,
    pipeline: &Pipeline,
    config: &Config,
    payload: &[u8],
) -> Option<bytes::Bytes> {
    let Some((user, frame)) = parse_forwarded(payload) else {
        tracing::warn!(bytes = payload.len(), "malformed forwarded send dropped");
        return None;
    };
    let frame = Frame::decode(frame).ok()?;
    let req_id = frame.req_id;
    let conversation = match &frame.body {
        Some(Body::Send(send)) => send
            .target
            .as_ref()
            .map(|t| crate::region::conversation_of(user, t)),
        Some(Body::GroupOp(op)) if !op.group_id.is_empty() => {
            Some(im_proto::group_conversation(&op.group_id))
        }
        Some(Body::Recall(r)) => Some(r.conversation_id.clone()),
        Some(Body::Edit(e)) => Some(e.conversation_id.clone()),
        _ => return None,
    };
    // Region lists that disagree would bounce a request between regions: refuse instead.
    if let Some(conversation) = conversation {
        if let Some((home, _)) = map.elsewhere(&conversation) {
            let message = format!(
                "region {} got a send for {conversation}, which it sees homed in {home}: \
                 the regions' lists disagree",
                map.local
            );
            let e = im_proto::error_frame(req_id, im_proto::ErrorCode::RegionUnavailable, message);
            return Some(im_proto::encode(&e));
        }
    }
    let (out, mut rx) = Outbound::new(
        0,
        "region forward".into(),
        config.flow.soft_mark_bytes,
        config.flow.hard_mark_bytes,
        pipeline.metrics.clone(),
    );
    let session = Session::new(user.to_owned(), out, &config.limits);
    match pipeline.handle(&session, frame, Instant::now()).await {
        Err(r) => Some(im_proto::encode(&r.to_frame(req_id))),
        Ok(()) => match tokio::time::timeout(FORWARD_TIMEOUT, rx.frames.recv()).await {
            Ok(Some(f)) => Some(f.bytes),
            _ => None,
        },
    }
}
