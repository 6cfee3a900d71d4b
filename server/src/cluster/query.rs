//! Query: cluster-wide admin questions answered by request/reply over NATS. Each node
//! answers on subject `<prefix>.query.<node_id>`; the node an operator asks sends one
//! request to every other live node at once, waits for each at most
//! `cluster.query_timeout_ms`, and merges what came back. Today's one question is the
//! per-user diagnosis (`GET /admin/v1/users/{uid}`): the answer is that node's
//! [`UserNode`] part (its sessions of the user, refusals, log filter, recent messages).
//!
//! Requests and replies are signed under `cluster.key` the way relay envelopes are
//! (HMAC-SHA256 of the encoded message without its `sig`); a reply must also name the
//! node asked, the user asked about and the request's nonce, and be at most
//! [`REPLY_MAX`] bytes. Anything else, and any request that fails the same checks, is
//! dropped and counted in `im_cluster_bad_queries_total`; the node is then listed as
//! missing, as is one that does not answer in time. A query never fails as a whole.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use im_admin_api::UserNode;
use prost::Message as _;
use tokio::task::JoinHandle;

use super::trust::{ClusterKey, Sealed};
use super::{Cluster, ClusterError, Link};
use crate::obs::runtime::{spawn, Task};

/// Largest reply accepted (and sent: a node trims its recent messages to fit).
pub const REPLY_MAX: usize = 512 * 1024;
/// Largest request a node answers.
const REQUEST_MAX: usize = 4 * 1024;

/// A question to another node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryRequest {
    /// The asking node.
    #[prost(string, tag = "1")]
    pub from: String,
    /// The node asked.
    #[prost(string, tag = "2")]
    pub to: String,
    /// The user asked about.
    #[prost(string, tag = "3")]
    pub uid: String,
    /// Most recent messages wanted.
    #[prost(uint32, tag = "4")]
    pub messages: u32,
    /// Echoed by the reply.
    #[prost(uint64, tag = "5")]
    pub nonce: u64,
    /// HMAC-SHA256 under `cluster.key` of the request without this field.
    #[prost(bytes = "bytes", tag = "6")]
    pub sig: Bytes,
}

/// A node's answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryReply {
    /// The answering node.
    #[prost(string, tag = "1")]
    pub from: String,
    /// The user asked about.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// The request's nonce.
    #[prost(uint64, tag = "3")]
    pub nonce: u64,
    /// The [`UserNode`] part, as JSON.
    #[prost(bytes = "bytes", tag = "4")]
    pub body: Bytes,
    /// HMAC-SHA256 under `cluster.key` of the reply without this field.
    #[prost(bytes = "bytes", tag = "5")]
    pub sig: Bytes,
}

/// Answers a query here: (user, most recent messages) -> this node's part.
pub type AnswerFn = Arc<dyn Fn(&str, usize) -> UserNode + Send + Sync>;

impl Sealed for QueryRequest {
    const DOMAIN: &'static [u8] = b"im-query-request\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

impl Sealed for QueryReply {
    const DOMAIN: &'static [u8] = b"im-query-reply\0";
    fn sig_mut(&mut self) -> &mut Bytes {
        &mut self.sig
    }
}

/// Reads a reply to `req` from `node`: its part, or `None` (counted as bad) when it is
/// oversized, undecodable, badly signed or not the answer to this request.
fn open_reply(
    key: &ClusterKey,
    req: &QueryRequest,
    node: &str,
    payload: &[u8],
) -> Option<UserNode> {
    if payload.len() > REPLY_MAX {
        return None;
    }
    let r = QueryReply::decode(payload).ok()?;
    if !key.check(&r) || r.from != node || r.uid != req.uid || r.nonce != req.nonce {
        return None;
    }
    let part: UserNode = serde_json::from_slice(&r.body).ok()?;
    (part.node_id == node && part.user_id == req.uid).then_some(part)
}

/// The reply to `req` with `part`, its recent messages trimmed until it fits
/// [`REPLY_MAX`].
fn reply_to(key: &ClusterKey, me: &str, req: &QueryRequest, mut part: UserNode) -> Option<Bytes> {
    loop {
        let body = serde_json::to_vec(&part).ok()?;
        let mut r = QueryReply {
            from: me.to_owned(),
            uid: req.uid.clone(),
            nonce: req.nonce,
            body: body.into(),
            sig: Bytes::new(),
        };
        key.seal(&mut r);
        let bytes = r.encode_to_vec();
        if bytes.len() <= REPLY_MAX {
            return Some(bytes.into());
        }
        if part.messages.is_empty() && part.sessions.is_empty() {
            return None;
        }
        if part.messages.is_empty() {
            part.sessions.truncate(part.sessions.len() / 2);
        } else {
            part.messages.truncate(part.messages.len() / 2);
        }
    }
}

impl Link {
    fn query_subject(&self, node: &str) -> String {
        format!("{}{node}", self.query_prefix())
    }

    fn query_prefix(&self) -> String {
        // `<prefix>.node.` -> `<prefix>.query.`
        let prefix = self
            .subject_prefix
            .strip_suffix("node.")
            .unwrap_or(&self.subject_prefix);
        format!("{prefix}query.")
    }

    /// Asks every other live node for its part of `uid`'s diagnosis, each within
    /// `timeout`: the parts that came back, and the nodes that did not answer usably.
    pub async fn query_user(
        &self,
        uid: &str,
        messages: u32,
        timeout: Duration,
    ) -> (Vec<UserNode>, Vec<String>) {
        let bad = metrics::counter!("im_cluster_bad_queries_total");
        let mut others: Vec<String> = self
            .registry
            .live_nodes()
            .into_iter()
            .filter(|n| *n != self.node_id)
            .collect();
        others.sort();
        let bad = &bad;
        let asks = others.iter().map(|node| {
            let mut req = QueryRequest {
                from: self.node_id.clone(),
                to: node.clone(),
                uid: uid.to_owned(),
                messages,
                nonce: rand::random(),
                sig: Bytes::new(),
            };
            self.key.seal(&mut req);
            let payload = Bytes::from(req.encode_to_vec());
            let subject = self.query_subject(node);
            async move {
                let answer =
                    tokio::time::timeout(timeout, self.client.request(subject, payload)).await;
                match answer {
                    Ok(Ok(msg)) => match open_reply(&self.key, &req, node, &msg.payload) {
                        Some(part) => Ok(part),
                        None => {
                            bad.increment(1);
                            tracing::debug!(node = %node, "dropping a bad cluster query reply");
                            Err(node.clone())
                        }
                    },
                    Ok(Err(e)) => {
                        tracing::debug!(node = %node, error = %e, "cluster query failed");
                        Err(node.clone())
                    }
                    Err(_) => Err(node.clone()),
                }
            }
        });
        let mut parts = Vec::new();
        let mut missing = Vec::new();
        for r in futures_util::future::join_all(asks).await {
            match r {
                Ok(p) => parts.push(p),
                Err(n) => missing.push(n),
            }
        }
        (parts, missing)
    }
}

impl Cluster {
    /// Subscribes to this node's query subject and answers each request with `answer`.
    pub async fn serve_queries(&self, answer: AnswerFn) -> Result<JoinHandle<()>, ClusterError> {
        let link = self.link.clone();
        let subject = link.query_subject(&link.node_id);
        let mut sub =
            link.client
                .subscribe(subject.clone())
                .await
                .map_err(|e| ClusterError::Subscribe {
                    subject,
                    message: e.to_string(),
                })?;
        let bad = metrics::counter!("im_cluster_bad_queries_total");
        bad.absolute(0);
        Ok(spawn(Task::Cluster, async move {
            while let Some(msg) = sub.next().await {
                let Some(reply) = msg.reply.clone() else {
                    bad.increment(1);
                    continue;
                };
                let req = match (msg.payload.len() <= REQUEST_MAX)
                    .then(|| QueryRequest::decode(msg.payload.clone()).ok())
                    .flatten()
                {
                    Some(r) if link.key.check(&r) && r.to == link.node_id => r,
                    _ => {
                        bad.increment(1);
                        tracing::debug!("ignoring a bad or unsigned cluster query");
                        continue;
                    }
                };
                if !im_proto::valid_id(&req.uid) {
                    bad.increment(1);
                    continue;
                }
                let part = answer(&req.uid, req.messages as usize);
                let Some(bytes) = reply_to(&link.key, &link.node_id, &req, part) else {
                    continue;
                };
                if let Err(e) = link.client.publish(reply, bytes).await {
                    tracing::debug!(error = %e, "could not answer a cluster query");
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> QueryRequest {
        QueryRequest {
            from: "a".into(),
            to: "b".into(),
            uid: "u1".into(),
            messages: 5,
            nonce: 7,
            sig: Bytes::new(),
        }
    }

    #[test]
    fn replies_are_checked_for_key_node_user_nonce_and_size() {
        let key = ClusterKey::new("secret-of-the-cluster");
        let mut req = request();
        key.seal(&mut req);
        assert!(key.check(&req));
        let part = UserNode {
            node_id: "b".into(),
            user_id: "u1".into(),
            ..Default::default()
        };
        let bytes = reply_to(&key, "b", &req, part.clone()).unwrap();
        assert_eq!(open_reply(&key, &req, "b", &bytes), Some(part.clone()));
        // The wrong node, a forged key, another nonce, an oversized payload.
        assert_eq!(open_reply(&key, &req, "c", &bytes), None);
        let other = ClusterKey::new("another-key-of-someone");
        assert_eq!(open_reply(&other, &req, "b", &bytes), None);
        let mut req2 = req.clone();
        req2.nonce = 8;
        assert_eq!(open_reply(&key, &req2, "b", &bytes), None);
        assert_eq!(open_reply(&key, &req, "b", &vec![0u8; REPLY_MAX + 1]), None);
        // Unsigned requests fail a keyed node's check.
        assert!(!key.check(&request()));
        assert!(ClusterKey::new("").check(&request()));
    }

    #[test]
    fn a_large_part_is_trimmed_to_fit() {
        let key = ClusterKey::new("");
        let req = request();
        let part = UserNode {
            node_id: "b".into(),
            user_id: "u1".into(),
            messages: (0..4000)
                .map(|i| im_admin_api::UserMessage {
                    msg_id: format!("{i:0>200}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let bytes = reply_to(&key, "b", &req, part).unwrap();
        assert!(bytes.len() <= REPLY_MAX);
        let back = open_reply(&key, &req, "b", &bytes).unwrap();
        assert!(!back.messages.is_empty() && back.messages.len() < 4000);
    }
}
