//! Region traces (multi-region mode): one node of each region answers requests for a
//! message's trace from the other regions on `im-region.<region>.trace` (a queue
//! group across the gateway) with its region's parts, its own and those its cluster
//! gather finds (`trace::gather`); the node serving the admin request asks every other
//! region at once and waits at most the cluster's trace timeout plus
//! [`REGION_MARGIN`] (the gateway's round trip). Query and reply are signed with
//! `cluster.key` like the cluster's trace traffic; a reply over [`MAX_REGION_REPLY_BYTES`],
//! with more than [`MAX_REGION_PARTS`] parts or bad stages, undecodable, badly signed
//! or not about the asked message and region is dropped and counted
//! (`im_trace_bad_replies_total`), and its region named as unanswered.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;

use super::trace::{self, NodePart, TraceReply};
use super::trust::Sealed;
use super::Link;
use crate::obs::trace::Tracer;

/// The largest region reply accepted (NATS' default `max_payload` is 1 MiB).
pub const MAX_REGION_REPLY_BYTES: usize = 900 * 1024;
/// The most node parts in one region reply.
pub const MAX_REGION_PARTS: usize = 64;
/// The most node names a region reply lists as unanswered.
const MAX_UNANSWERED: usize = 64;
/// What a region request waits for beyond the answering region's own gather.
pub const REGION_MARGIN: Duration = Duration::from_secs(1);

/// A request for a region's parts of a message's trace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegionTraceQuery {
    /// The message id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The asking region.
    #[prost(string, tag = "2")]
    pub from_region: String,
    /// HMAC-SHA256 under `cluster.key` of the query without this field.
    #[prost(bytes = "bytes", tag = "3")]
    pub sig: Bytes,
}

/// A region's answer: the parts its nodes hold.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegionTraceReply {
    /// The answering region.
    #[prost(string, tag = "1")]
    pub region: String,
    /// The message id asked for.
    #[prost(string, tag = "2")]
    pub msg_id: String,
    /// One unsigned `TraceReply` per node holding a part (at most [`MAX_REGION_PARTS`]).
    #[prost(message, repeated, tag = "3")]
    pub parts: Vec<TraceReply>,
    /// The region's live nodes that did not answer its gather in time.
    #[prost(string, repeated, tag = "4")]
    pub nodes_unanswered: Vec<String>,
    /// HMAC-SHA256 under `cluster.key` of the reply without this field.
    #[prost(bytes = "bytes", tag = "5")]
    pub sig: Bytes,
}

impl Sealed for RegionTraceQuery {
    const DOMAIN: &'static [u8] = b"im-region-trace-query\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

impl Sealed for RegionTraceReply {
    const DOMAIN: &'static [u8] = b"im-region-trace-reply\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

/// The subject where region `region` answers trace requests.
pub fn subject(region: &str) -> String {
    format!("im-region.{region}.trace")
}

/// What the other regions answered.
#[derive(Debug, Default)]
pub struct RegionsGathered {
    /// Each part with the region it came from.
    pub parts: Vec<(String, NodePart)>,
    /// Nodes the answering regions could not reach in time.
    pub nodes_unanswered: Vec<String>,
    /// Regions asked that sent no usable answer in time.
    pub regions_unanswered: Vec<String>,
}

/// Answers region trace requests for `region` until the subscription ends (one node
/// of the region answers each: a queue group).
pub async fn serve(link: Arc<Link>, tracer: Arc<Tracer>, region: String) {
    let subject = subject(&region);
    let mut sub = match link
        .client
        .queue_subscribe(subject.clone(), "im-region-trace".into())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(%subject, error = %e, "cannot answer region trace requests");
            return;
        }
    };
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply else {
            continue;
        };
        let q = match RegionTraceQuery::decode(msg.payload) {
            Ok(q) if link.key.check(&q) && im_admin_api::valid_msg_id(&q.msg_id) => q,
            _ => {
                tracing::debug!("ignoring an undecodable or badly signed region trace request");
                continue;
            }
        };
        let (link, tracer, region) = (link.clone(), tracer.clone(), region.clone());
        tokio::spawn(async move {
            let r = region_reply(&link, &tracer, &region, &q.msg_id).await;
            if let Err(e) = link
                .client
                .publish(reply, Bytes::from(r.encode_to_vec()))
                .await
            {
                tracing::debug!(error = %e, "could not answer a region trace request");
            }
        });
    }
}

/// This region's signed reply for `msg_id`: this node's part and its cluster's,
/// bounded in parts and bytes (the stages of the parts past the bound are left out).
async fn region_reply(
    link: &Link,
    tracer: &Tracer,
    region: &str,
    msg_id: &str,
) -> RegionTraceReply {
    let mut parts: Vec<TraceReply> = tracer
        .get(msg_id)
        .map(|p| trace::wire_part(&link.node_id, msg_id, Some(p)))
        .into_iter()
        .collect();
    let g = trace::gather(link, msg_id, link.trace_timeout).await;
    parts.extend(
        g.parts
            .into_iter()
            .map(|p| trace::wire_part(&p.node, msg_id, Some(p.part))),
    );
    parts.truncate(MAX_REGION_PARTS);
    let mut r = RegionTraceReply {
        region: region.to_owned(),
        msg_id: msg_id.to_owned(),
        parts,
        nodes_unanswered: g.unanswered.into_iter().take(MAX_UNANSWERED).collect(),
        sig: Bytes::new(),
    };
    while r.encoded_len() > MAX_REGION_REPLY_BYTES && r.parts.pop().is_some() {}
    link.key.seal(&mut r);
    r
}

/// Checks and decodes region `region`'s reply for `msg_id`: its parts and the nodes
/// it could not reach, or why it is refused.
pub fn read_region_reply(
    payload: &[u8],
    region: &str,
    msg_id: &str,
    link_key: &super::trust::ClusterKey,
) -> Result<(Vec<NodePart>, Vec<String>), trace::BadReply> {
    use trace::BadReply;
    if payload.len() > MAX_REGION_REPLY_BYTES {
        return Err(BadReply::TooLarge);
    }
    let r = RegionTraceReply::decode(payload).map_err(|_| BadReply::Undecodable)?;
    if !link_key.check(&r) {
        return Err(BadReply::BadSignature);
    }
    if r.region != region || r.msg_id != msg_id {
        return Err(BadReply::Mismatch);
    }
    if r.parts.len() > MAX_REGION_PARTS || r.nodes_unanswered.len() > MAX_UNANSWERED {
        return Err(BadReply::BadStages);
    }
    let mut parts = Vec::with_capacity(r.parts.len());
    for p in r.parts {
        if p.msg_id != msg_id {
            return Err(BadReply::Mismatch);
        }
        parts.extend(trace::part_of(p)?);
    }
    Ok((parts, r.nodes_unanswered))
}

/// Asks every region of `regions` at once for its parts of `msg_id`, waiting at most
/// the cluster's trace timeout plus [`REGION_MARGIN`]; a region without a usable
/// answer is named in `regions_unanswered` (bad replies counted).
pub async fn gather_regions(
    link: &Link,
    local: &str,
    regions: &[String],
    msg_id: &str,
) -> RegionsGathered {
    let bad = metrics::counter!("im_trace_bad_replies_total");
    let mut q = RegionTraceQuery {
        msg_id: msg_id.to_owned(),
        from_region: local.to_owned(),
        sig: Bytes::new(),
    };
    link.key.seal(&mut q);
    let payload = Bytes::from(q.encode_to_vec());
    let timeout = link.trace_timeout + REGION_MARGIN;
    let asks = regions
        .iter()
        .filter(|r| r.as_str() != local)
        .map(|region| {
            let payload = payload.clone();
            async move {
                let ask = link.client.request(subject(region), payload);
                (region, tokio::time::timeout(timeout, ask).await)
            }
        });
    let mut out = RegionsGathered::default();
    for (region, answer) in futures_util::future::join_all(asks).await {
        let read = match answer {
            Ok(Ok(msg)) => read_region_reply(&msg.payload, region, msg_id, &link.key),
            _ => {
                out.regions_unanswered.push(region.clone());
                continue;
            }
        };
        match read {
            Ok((parts, unanswered)) => {
                out.parts
                    .extend(parts.into_iter().map(|p| (region.clone(), p)));
                out.nodes_unanswered.extend(unanswered);
            }
            Err(why) => {
                bad.increment(1);
                tracing::debug!(region = %region, ?why, "dropped a region trace reply");
                out.regions_unanswered.push(region.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::trust::ClusterKey;
    use crate::obs::trace::{Part, Span};
    use crate::obs::Stage;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn reply(key: &ClusterKey, parts: Vec<TraceReply>) -> RegionTraceReply {
        let mut r = RegionTraceReply {
            region: "a".into(),
            msg_id: ID.into(),
            parts,
            nodes_unanswered: vec!["a1".into()],
            sig: Bytes::new(),
        };
        key.seal(&mut r);
        r
    }

    fn part(node: &str) -> TraceReply {
        let p = Part {
            msg_id: ID.into(),
            sender: "alice".into(),
            conversation: "u:alice:bob".into(),
            seq: 3,
            spans: vec![Span {
                stage: Stage::PersistCommit,
                start_unix_ns: 5,
                duration_ns: 7,
                recipient: None,
            }],
            recipients_omitted: 0,
        };
        trace::wire_part(node, ID, Some(p))
    }

    #[test]
    fn a_signed_region_reply_reads_back_and_bad_ones_do_not() {
        let key = ClusterKey::new("k");
        let r = reply(&key, vec![part("a0"), trace::wire_part("a2", ID, None)]);
        let (parts, unanswered) = read_region_reply(&r.encode_to_vec(), "a", ID, &key).unwrap();
        assert_eq!(parts.len(), 1, "a node without a part adds none");
        assert_eq!(parts[0].node, "a0");
        assert_eq!(parts[0].part.spans[0].stage, Stage::PersistCommit);
        assert_eq!(unanswered, ["a1"]);
        let bytes = r.encode_to_vec();
        use trace::BadReply;
        let other = ClusterKey::new("other");
        assert_eq!(
            read_region_reply(&bytes, "a", ID, &other).unwrap_err(),
            BadReply::BadSignature
        );
        assert_eq!(
            read_region_reply(&bytes, "c", ID, &key).unwrap_err(),
            BadReply::Mismatch
        );
        let mut moved = part("a0");
        moved.msg_id = "ffffffffffffffffffffffffffffffff".into();
        let r2 = reply(&key, vec![moved]);
        assert_eq!(
            read_region_reply(&r2.encode_to_vec(), "a", ID, &key).unwrap_err(),
            BadReply::Mismatch
        );
        let many = reply(&key, vec![part("a0"); MAX_REGION_PARTS + 1]);
        assert_eq!(
            read_region_reply(&many.encode_to_vec(), "a", ID, &key).unwrap_err(),
            BadReply::BadStages
        );
        let big = vec![0u8; MAX_REGION_REPLY_BYTES + 1];
        assert_eq!(
            read_region_reply(&big, "a", ID, &key).unwrap_err(),
            BadReply::TooLarge
        );
        let mut q = RegionTraceQuery {
            msg_id: ID.into(),
            from_region: "b".into(),
            sig: Bytes::new(),
        };
        key.seal(&mut q);
        assert!(key.check(&q) && !other.check(&q));
    }
}
