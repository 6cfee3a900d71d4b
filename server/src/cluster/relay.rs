//! Relay: the envelope one node publishes to another's subject (`<prefix>.node.<id>`)
//! for cross-node delivery, one per receiving node per message (never one per member),
//! and the group-change notice that evicts a stale membership cache entry.

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
    /// HMAC-SHA256 under `cluster.key` of the envelope without this field (empty
    /// without a key).
    #[prost(bytes = "bytes", tag = "6")]
    pub sig: Bytes,
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
            group_changed: String::new(),
            sig: Bytes::new(),
        };
        let bytes = e.encode_to_vec();
        assert_eq!(Envelope::decode(&bytes[..]).unwrap(), e);
        assert!(Envelope::decode(&b"\xff\xff"[..]).is_err());
    }
}
