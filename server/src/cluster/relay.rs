//! Relay: the envelope one node publishes to another's subject (`<prefix>.node.<id>`)
//! for cross-node delivery, one per receiving node per message (never one per member),
//! the group-change notice that evicts a stale membership cache entry, the revocation
//! notice that closes a user's sessions, and the resync notice (to one node, or to
//! every node on `<prefix>.all`) after pushes may have been lost. A traced message's
//! envelope also carries its trace context (`trace`, an optional field older nodes
//! ignore), signed apart (`trace_sig`) so that `sig` covers what it always covered; so
//! is the `notify` mark of a large group's message (`notify_sig`).

use bytes::Bytes;

/// What crosses from one node to another.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Envelope {
    /// The sending node.
    #[prost(string, tag = "1")]
    pub from: String,
    /// Users on the receiving node to push to (all their sessions there).
    #[prost(string, repeated, tag = "2")]
    pub users: Vec<String>,
    /// The encoded `Deliver` frame, ready to queue; empty means a sync hint
    /// (notify-and-pull) instead of the payload.
    #[prost(bytes = "bytes", tag = "3")]
    pub frame: Bytes,
    /// A one-to-one message (critical: queued even for a slow consumer).
    #[prost(bool, tag = "4")]
    pub direct: bool,
    /// Set on a group-change notice: evict this group from the membership cache.
    #[prost(string, tag = "5")]
    pub group_changed: String,
    /// A resync notice: the sender's cluster link was down or failed to publish, so
    /// pushes and group notices may have been lost; every session on the receiving node
    /// gets a sync hint and the membership cache is dropped.
    #[prost(bool, tag = "6")]
    pub resync: bool,
    /// HMAC-SHA256 under `cluster.key` of the envelope without this field (empty
    /// without a key).
    #[prost(bytes = "bytes", tag = "7")]
    pub sig: Bytes,
    /// With `group_changed`: the change's version (seq); older cached copies are evicted.
    #[prost(uint64, tag = "8")]
    pub group_version: u64,
    /// Set on a revocation notice: close this user's sessions, refuse their tokens
    /// issued at or before `revoked_at`.
    #[prost(string, tag = "9")]
    pub revoked_user: String,
    /// With `revoked_user`: unix seconds.
    #[prost(int64, tag = "10")]
    pub revoked_at: i64,
    /// An ephemeral push (typing): queued only to connections that are not slow.
    #[prost(bool, tag = "11")]
    pub ephemeral: bool,
    /// Set on a presence notice: this user now hides (or shows) their presence.
    #[prost(string, tag = "12")]
    pub presence_user: String,
    /// With `presence_user`: hidden from now on.
    #[prost(bool, tag = "13")]
    pub presence_hidden: bool,
    /// A traced message: the receiving node records its stages under this msg_id.
    /// Not covered by `sig` (which an older node checks without knowing this field).
    #[prost(message, optional, tag = "14")]
    pub trace: Option<TraceCtx>,
    /// With `trace` and a cluster key: HMAC-SHA256 of `sig` and the encoded `trace`.
    #[prost(bytes = "bytes", tag = "15")]
    pub trace_sig: Bytes,
    /// A large group's message (notify-and-pull): `frame` carries it, and the receiving
    /// node files it in its recent window and hints instead of pushing. An older node,
    /// which does not know this field, pushes the frame. Not covered by `sig`.
    #[prost(bool, tag = "16")]
    pub notify: bool,
    /// With `notify` and a cluster key: HMAC-SHA256 of a tag and `sig`.
    #[prost(bytes = "bytes", tag = "17")]
    pub notify_sig: Bytes,
}

/// The trace context of a traced message (`obs::trace::TraceContext` on the wire).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TraceCtx {
    /// The message id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The sender.
    #[prost(string, tag = "2")]
    pub sender: String,
    /// The conversation.
    #[prost(string, tag = "3")]
    pub conversation: String,
    /// The seq.
    #[prost(uint64, tag = "4")]
    pub seq: u64,
}

impl From<&crate::obs::trace::TraceContext> for TraceCtx {
    fn from(c: &crate::obs::trace::TraceContext) -> Self {
        TraceCtx {
            msg_id: c.msg_id.clone(),
            sender: c.sender.clone(),
            conversation: c.conversation.clone(),
            seq: c.seq,
        }
    }
}

impl From<TraceCtx> for crate::obs::trace::TraceContext {
    fn from(c: TraceCtx) -> Self {
        crate::obs::trace::TraceContext {
            msg_id: c.msg_id,
            sender: c.sender,
            conversation: c.conversation,
            seq: c.seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn envelope_round_trips() {
        let e = Envelope {
            from: "a".into(),
            users: vec!["u1".into(), "u2".into()],
            frame: Bytes::from_static(b"\x08\x01"),
            direct: true,
            ..Default::default()
        };
        let bytes = e.encode_to_vec();
        assert_eq!(Envelope::decode(&bytes[..]).unwrap(), e);
        assert!(Envelope::decode(&b"\xff\xff"[..]).is_err());
        // A node without the resync field reads a notice as an empty envelope.
        let notice = Envelope {
            from: "a".into(),
            resync: true,
            ..Default::default()
        };
        let back = Envelope::decode(&notice.encode_to_vec()[..]).unwrap();
        assert!(back.resync && back.users.is_empty() && back.frame.is_empty());
    }

    /// The envelope as a node that predates the trace fields declares it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct OldEnvelope {
        #[prost(string, tag = "1")]
        from: String,
        #[prost(string, repeated, tag = "2")]
        users: Vec<String>,
        #[prost(bytes = "bytes", tag = "3")]
        frame: Bytes,
        #[prost(bytes = "bytes", tag = "7")]
        sig: Bytes,
    }

    /// A node that predates the trace and notify fields drops them and checks `sig`
    /// (under the key "k") over what it knows: it must hold.
    fn an_old_node_checks_sig(e: &Envelope) {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k");
        let mut old = OldEnvelope::decode(&e.encode_to_vec()[..]).unwrap();
        let sig = std::mem::take(&mut old.sig);
        assert!(ring::hmac::verify(&key, &old.encode_to_vec(), &sig).is_ok());
    }

    #[test]
    fn an_old_node_reads_a_traced_envelope_and_its_signature_holds() {
        let k = crate::cluster::trust::ClusterKey::new("k");
        let mut e = Envelope {
            from: "a".into(),
            users: vec!["u1".into()],
            frame: Bytes::from_static(b"\x08\x01"),
            trace: Some(TraceCtx {
                msg_id: "0123456789abcdef0123456789abcdef".into(),
                seq: 3,
                ..Default::default()
            }),
            ..Default::default()
        };
        k.seal_envelope(&mut e);
        assert!(k.check_envelope(&e) && k.check_trace(&e));
        an_old_node_checks_sig(&e);
        // A forged trace fails its own check, not the delivery's.
        let mut forged = e.clone();
        if let Some(t) = forged.trace.as_mut() {
            t.seq = 4;
        }
        assert!(k.check_envelope(&forged) && !k.check_trace(&forged));
    }

    #[test]
    fn an_old_node_reads_a_notify_envelope_as_a_push_and_a_forged_mark_is_not_believed() {
        let k = crate::cluster::trust::ClusterKey::new("k");
        let mut e = Envelope {
            from: "a".into(),
            users: vec!["u1".into()],
            frame: Bytes::from_static(b"\x08\x01"),
            notify: true,
            ..Default::default()
        };
        k.seal_envelope(&mut e);
        assert!(k.check_envelope(&e) && k.check_notify(&e));
        an_old_node_checks_sig(&e);
        let old = OldEnvelope::decode(&e.encode_to_vec()[..]).unwrap();
        assert_eq!(old.frame, e.frame, "the old node pushes the frame");
        // A mark added to a signed push fails its own check; the push still stands.
        let mut plain = Envelope {
            notify: false,
            ..e.clone()
        };
        k.seal_envelope(&mut plain);
        plain.notify = true;
        assert!(k.check_envelope(&plain) && !k.check_notify(&plain));
    }
}
