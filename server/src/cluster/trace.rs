//! Cluster traces: each node answers requests for its part of a message's trace on
//! `<prefix>.trace.<node_id>` (NATS request/reply, query and reply signed with the
//! cluster key like the relay envelope), and the node serving the admin request asks
//! every other live node at once, waits at most `cluster.trace_timeout_ms`, and drops
//! (and counts in `im_trace_bad_replies_total`) any reply over [`MAX_REPLY_BYTES`] or
//! [`MAX_REPLY_STAGES`], undecodable, badly signed, or not about the asked message.
//! Merging the parts in time order is the caller's (`admin::trace`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message as _;

use super::trust::{ClusterKey, Sealed};
use super::Link;
use crate::obs::trace::{Part, Span, Tracer};
use crate::obs::Stage;

/// The largest reply a node accepts from another.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;
/// The most stages a node accepts in one reply.
pub const MAX_REPLY_STAGES: usize = 1000;

/// A request for one node's part of a message's trace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceQuery {
    /// The message id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The asking node.
    #[prost(string, tag = "2")]
    pub from: String,
    /// HMAC-SHA256 under `cluster.key` of the query without this field.
    #[prost(bytes = "bytes", tag = "3")]
    pub sig: Bytes,
}

/// One stage on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireStage {
    /// Stage name (`obs::Stage::name`).
    #[prost(string, tag = "1")]
    pub stage: String,
    /// Wall-clock start, ns since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub start_unix_ns: i64,
    /// Duration in ns.
    #[prost(uint64, tag = "3")]
    pub duration_ns: u64,
    /// Recipient of a per-recipient stage (empty otherwise).
    #[prost(string, tag = "4")]
    pub recipient: String,
}

/// A node's answer: its part of the trace, or `found: false`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceReply {
    /// The answering node.
    #[prost(string, tag = "1")]
    pub node: String,
    /// The message id asked for.
    #[prost(string, tag = "2")]
    pub msg_id: String,
    /// Whether the node holds a part.
    #[prost(bool, tag = "3")]
    pub found: bool,
    /// The sender.
    #[prost(string, tag = "4")]
    pub sender: String,
    /// The conversation.
    #[prost(string, tag = "5")]
    pub conversation: String,
    /// The seq.
    #[prost(uint64, tag = "6")]
    pub seq: u64,
    /// The stages (at most [`MAX_REPLY_STAGES`]).
    #[prost(message, repeated, tag = "7")]
    pub stages: Vec<WireStage>,
    /// Recipients whose stages were not recorded.
    #[prost(uint64, tag = "8")]
    pub recipients_omitted: u64,
    /// HMAC-SHA256 under `cluster.key` of the reply without this field.
    #[prost(bytes = "bytes", tag = "9")]
    pub sig: Bytes,
}

/// One node's part, as gathered.
#[derive(Debug, Clone)]
pub struct NodePart {
    /// The node that recorded it.
    pub node: String,
    /// What it recorded.
    pub part: Part,
}

/// What a gather found: the parts and the nodes that did not answer in time.
#[derive(Debug, Default)]
pub struct Gathered {
    /// Parts of the other nodes that hold one.
    pub parts: Vec<NodePart>,
    /// Nodes asked that sent no usable reply within the timeout.
    pub unanswered: Vec<String>,
}

/// The subject a node answers trace requests on.
pub fn subject(prefix: &str, node: &str) -> String {
    format!("{prefix}.trace.{node}")
}

fn stage_by_name(name: &str) -> Option<Stage> {
    Stage::ALL.into_iter().find(|s| s.name() == name)
}

impl Sealed for TraceQuery {
    const DOMAIN: &'static [u8] = b"im-trace-query\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

impl Sealed for TraceReply {
    const DOMAIN: &'static [u8] = b"im-trace-reply\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

/// This node's reply to a query for `msg_id` (stages capped at [`MAX_REPLY_STAGES`]).
pub fn reply_for(tracer: &Tracer, node: &str, msg_id: &str, key: &ClusterKey) -> TraceReply {
    let mut r = wire_part(node, msg_id, tracer.get(msg_id));
    key.seal(&mut r);
    r
}

/// A node's part (or none) as an unsigned reply (stages capped at
/// [`MAX_REPLY_STAGES`]).
pub fn wire_part(node: &str, msg_id: &str, part: Option<Part>) -> TraceReply {
    let mut r = TraceReply {
        node: node.to_owned(),
        msg_id: msg_id.to_owned(),
        ..Default::default()
    };
    if let Some(p) = part {
        r.found = true;
        r.sender = p.sender;
        r.conversation = p.conversation;
        r.seq = p.seq;
        r.recipients_omitted = p.recipients_omitted;
        r.stages = p
            .spans
            .into_iter()
            .take(MAX_REPLY_STAGES)
            .map(|s| WireStage {
                stage: s.stage.name().to_owned(),
                start_unix_ns: s.start_unix_ns,
                duration_ns: s.duration_ns,
                recipient: s.recipient.map(|r| r.to_string()).unwrap_or_default(),
            })
            .collect();
    }
    r
}

/// Why a reply was dropped.
#[derive(Debug, PartialEq, Eq)]
pub enum BadReply {
    /// Over [`MAX_REPLY_BYTES`].
    TooLarge,
    /// Not a `TraceReply`.
    Undecodable,
    /// Unsigned or badly signed.
    BadSignature,
    /// Over [`MAX_REPLY_STAGES`], or a stage name this node does not know.
    BadStages,
    /// About another message or from another node than asked.
    Mismatch,
}

/// Checks and decodes the reply of `node` for `msg_id`: its part (`None` when it holds
/// none) or why it is refused.
pub fn read_reply(
    payload: &[u8],
    node: &str,
    msg_id: &str,
    key: &ClusterKey,
) -> Result<Option<NodePart>, BadReply> {
    if payload.len() > MAX_REPLY_BYTES {
        return Err(BadReply::TooLarge);
    }
    let r = TraceReply::decode(payload).map_err(|_| BadReply::Undecodable)?;
    if !key.check(&r) {
        return Err(BadReply::BadSignature);
    }
    if r.msg_id != msg_id || r.node != node {
        return Err(BadReply::Mismatch);
    }
    part_of(r)
}

/// The part a (checked) reply carries: `None` when its node holds none, an error when
/// it has too many stages or one this node does not know.
pub fn part_of(r: TraceReply) -> Result<Option<NodePart>, BadReply> {
    if r.stages.len() > MAX_REPLY_STAGES {
        return Err(BadReply::BadStages);
    }
    if !r.found {
        return Ok(None);
    }
    let mut spans = Vec::with_capacity(r.stages.len());
    for s in r.stages {
        let stage = stage_by_name(&s.stage).ok_or(BadReply::BadStages)?;
        spans.push(Span {
            stage,
            start_unix_ns: s.start_unix_ns,
            duration_ns: s.duration_ns,
            recipient: (!s.recipient.is_empty()).then(|| Arc::from(s.recipient.as_str())),
        });
    }
    Ok(Some(NodePart {
        node: r.node,
        part: Part {
            msg_id: r.msg_id,
            sender: r.sender,
            conversation: r.conversation,
            seq: r.seq,
            spans,
            recipients_omitted: r.recipients_omitted,
        },
    }))
}

/// Answers the trace requests on this node's subject until the subscription ends.
pub async fn serve(link: Arc<Link>, mut sub: async_nats::Subscriber, tracer: Arc<Tracer>) {
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply else {
            continue;
        };
        let q = match TraceQuery::decode(msg.payload) {
            Ok(q) if link.key.check(&q) => q,
            _ => {
                tracing::debug!("ignoring an undecodable or badly signed trace request");
                continue;
            }
        };
        let r = reply_for(&tracer, &link.node_id, &q.msg_id, &link.key);
        let bytes = Bytes::from(r.encode_to_vec());
        if let Err(e) = link.client.publish(reply, bytes).await {
            tracing::debug!(error = %e, "could not answer a trace request");
        }
    }
}

/// Asks every other live node for its part of `msg_id`, at once, waiting at most
/// `timeout`; bad replies are dropped and counted.
pub async fn gather(link: &Link, msg_id: &str, timeout: Duration) -> Gathered {
    let bad = metrics::counter!("im_trace_bad_replies_total");
    let nodes: Vec<String> = link
        .registry
        .live_nodes()
        .into_iter()
        .filter(|n| *n != link.node_id)
        .collect();
    let mut q = TraceQuery {
        msg_id: msg_id.to_owned(),
        from: link.node_id.clone(),
        ..Default::default()
    };
    link.key.seal(&mut q);
    let payload = Bytes::from(q.encode_to_vec());
    let asks = nodes.into_iter().map(|node| {
        let payload = payload.clone();
        async move {
            let subject = subject(&link.trace_prefix, &node);
            let answer = tokio::time::timeout(timeout, link.client.request(subject, payload)).await;
            (node, answer)
        }
    });
    let mut out = Gathered::default();
    for (node, answer) in futures_util::future::join_all(asks).await {
        match answer {
            Ok(Ok(msg)) => match read_reply(&msg.payload, &node, msg_id, &link.key) {
                Ok(Some(p)) => out.parts.push(p),
                Ok(None) => {}
                Err(why) => {
                    bad.increment(1);
                    tracing::debug!(node = %node, ?why, "dropped a trace reply");
                    out.unanswered.push(node);
                }
            },
            _ => out.unanswered.push(node),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn tracer_with_part() -> Tracer {
        let t = Tracer::default();
        t.configure("n2", 0.0, 4, 4);
        let mut trace = crate::obs::trace::Trace::new("alice", Instant::now());
        trace.set_message(ID, "u:alice:bob");
        let now = Instant::now();
        trace.stage(Stage::Route, now, now);
        t.file(trace.part().clone());
        t
    }

    #[test]
    fn a_signed_reply_reads_back_and_forgeries_do_not() {
        let key = ClusterKey::new("k");
        let t = tracer_with_part();
        let r = reply_for(&t, "n2", ID, &key);
        let bytes = r.encode_to_vec();
        let part = read_reply(&bytes, "n2", ID, &key).unwrap().unwrap();
        assert_eq!(part.part.spans.len(), 1);
        assert_eq!(part.part.spans[0].stage, Stage::Route);
        assert_eq!(
            read_reply(&bytes, "n2", ID, &ClusterKey::new("other")).unwrap_err(),
            BadReply::BadSignature
        );
        assert_eq!(
            read_reply(&bytes, "n3", ID, &key).unwrap_err(),
            BadReply::Mismatch
        );
        assert_eq!(
            read_reply(b"\xff\xff", "n2", ID, &key).unwrap_err(),
            BadReply::Undecodable
        );
        let big = vec![0u8; MAX_REPLY_BYTES + 1];
        assert_eq!(
            read_reply(&big, "n2", ID, &key).unwrap_err(),
            BadReply::TooLarge
        );
        let mut many = r.clone();
        many.stages = vec![WireStage::default(); MAX_REPLY_STAGES + 1];
        key.seal(&mut many);
        assert_eq!(
            read_reply(&many.encode_to_vec(), "n2", ID, &key).unwrap_err(),
            BadReply::BadStages
        );
        let none = reply_for(&t, "n2", "ffffffffffffffffffffffffffffffff", &key);
        assert!(read_reply(
            &none.encode_to_vec(),
            "n2",
            "ffffffffffffffffffffffffffffffff",
            &key
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn queries_are_signed() {
        let key = ClusterKey::new("k");
        let mut q = TraceQuery {
            msg_id: ID.into(),
            from: "n1".into(),
            ..Default::default()
        };
        key.seal(&mut q);
        assert!(key.check(&q));
        q.msg_id = "x".into();
        assert!(!key.check(&q));
    }
}
