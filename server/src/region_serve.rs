//! Multi-region, the home's side of forwarding: this region's nodes take the Sends,
//! GroupOps, Recalls and Edits other regions forward (a NATS queue group on `region::send_subject`, one
//! node answers each) and run each through the ordinary pipeline as its sender, on a
//! connection-less session whose queue receives the reply; the answer (the SendAck or
//! GroupOpOk, queued only after the durable commit, or the Error) goes back as the
//! request's reply. A request with a valid trace context (`region::TRACE_HEADER`) is
//! traced here whatever this node samples; one from a region whose `regions` list
//! differs (`region_list`) is refused. It lives apart from
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
        let how = Forwarded {
            traced: traced(&map, msg.headers.as_ref(), sig),
            lists_differ: lists_differ(&map, msg.headers.as_ref()),
        };
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
            if let Some(answer) = answer(&map, &pipeline, &config, &msg.payload, how).await {
                let _ = client.publish(reply, answer).await;
            }
            drop(permit);
        });
    }
}

/// What a forwarded request's headers say beyond its signature.
#[derive(Debug, Clone, Copy)]
struct Forwarded {
    /// It carries a valid trace context: traced here too.
    traced: bool,
    /// Its region announced a different `regions` list: refused.
    lists_differ: bool,
}

/// Whether a request signed `sig` carries a valid trace context (`region::TRACE_HEADER`).
fn traced(map: &RegionMap, headers: Option<&async_nats::HeaderMap>, sig: Option<&str>) -> bool {
    let get = |n: &str| headers.and_then(|h| h.get(n)).map(|v| v.as_str());
    let trace = get(crate::region::TRACE_HEADER);
    let ok = map.verify_trace(sig, trace, get(crate::region::TRACE_SIG_HEADER));
    if ok {
        tracing::debug!(origin = ?trace, "forwarded request traced");
    }
    ok
}

/// Whether the request's region (one of the configured ones) announced a different
/// `regions` list (`region_list`; counted in `im_region_config_mismatch`).
fn lists_differ(map: &RegionMap, headers: Option<&async_nats::HeaderMap>) -> bool {
    use crate::region_list::{Verdict, FROM_HEADER};
    let from = headers.and_then(|h| h.get(FROM_HEADER)).map(|v| v.as_str());
    let Some(from) = from.filter(|f| *f != map.local && map.names.iter().any(|n| n.as_str() == *f))
    else {
        return false;
    };
    map.lists.check_headers(from, headers) == Verdict::Differs
}

/// The encoded answer to one forwarded request (`None`: malformed, not answered).
async fn answer(
    map: &RegionMap,
    pipeline: &Pipeline,
    config: &Config,
    payload: &[u8],
    how: Forwarded,
) -> Option<bytes::Bytes> {
    let Some((user, frame)) = parse_forwarded(payload) else {
        tracing::warn!(bytes = payload.len(), "malformed forwarded send dropped");
        return None;
    };
    let started = Instant::now();
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
    if how.lists_differ {
        let message = format!(
            "region {} refuses forwarded requests from a region whose regions list differs \
             (see im_region_config_mismatch)",
            map.local
        );
        let e = im_proto::error_frame(req_id, im_proto::ErrorCode::RegionUnavailable, message);
        return Some(im_proto::encode(&e));
    }
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
    let mut session = Session::new(user.to_owned(), out);
    session.trace_forced = how.traced;
    match pipeline.handle(&session, frame, started).await {
        Err(r) => Some(im_proto::encode(&r.to_frame(req_id))),
        Ok(()) => match tokio::time::timeout(FORWARD_TIMEOUT, rx.frames.recv()).await {
            Ok(Some(f)) => Some(f.bytes),
            _ => None,
        },
    }
}
