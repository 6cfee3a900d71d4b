//! im-proto: the `im.v1` wire contract shared by the server, the client SDK, the bench
//! and the console. It owns the generated prost types, the conversation id format and
//! the few encoding helpers every side needs (frame builders, zero-copy batching).

/// Generated types of package `im.v1` (see `proto/im/v1/im.proto`).
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/im.v1.rs"));
}

use bytes::{BufMut, Bytes, BytesMut};
pub use prost::Message;
pub use v1::frame::Body;
pub use v1::*;

/// Largest user or group id the contract accepts, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// Whether `id` is a valid user or group id: 1..=64 bytes of `[A-Za-z0-9_.@-]`.
/// The colon is excluded so conversation ids stay unambiguous.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
}

/// Conversation id of a one-to-one chat: `u:<a>:<b>` with the two user ids sorted.
pub fn direct_conversation(a: &str, b: &str) -> String {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    // Built by hand: `format!` costs more than the rest of a one-to-one route.
    let mut id = String::with_capacity(3 + lo.len() + hi.len());
    id.push_str("u:");
    id.push_str(lo);
    id.push(':');
    id.push_str(hi);
    id
}

/// Conversation id of a group: `g:<group_id>`.
pub fn group_conversation(group_id: &str) -> String {
    format!("g:{group_id}")
}

/// A conversation id taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationRef<'a> {
    /// One-to-one between two users (sorted).
    Direct(&'a str, &'a str),
    /// A group by its id.
    Group(&'a str),
}

/// Parses a conversation id; `None` when it is not of the two contract forms.
pub fn parse_conversation(id: &str) -> Option<ConversationRef<'_>> {
    if let Some(rest) = id.strip_prefix("u:") {
        let (a, b) = rest.split_once(':')?;
        (valid_id(a) && valid_id(b) && a <= b).then_some(ConversationRef::Direct(a, b))
    } else {
        let g = id.strip_prefix("g:")?;
        valid_id(g).then_some(ConversationRef::Group(g))
    }
}

impl ConversationRef<'_> {
    /// Whether `user` takes part in this one-to-one conversation (always false for groups).
    pub fn is_direct_party(&self, user: &str) -> bool {
        matches!(self, ConversationRef::Direct(a, b) if *a == user || *b == user)
    }
}

/// Builds a frame with the given request id and body.
pub fn frame(req_id: u64, body: Body) -> Frame {
    Frame {
        req_id,
        body: Some(body),
    }
}

/// Builds an `Error` frame.
pub fn error_frame(req_id: u64, code: ErrorCode, message: impl Into<String>) -> Frame {
    frame(
        req_id,
        Body::Error(Error {
            code: code as i32,
            message: message.into(),
            retry_after_ms: 0,
        }),
    )
}

/// Encodes a frame into fresh bytes.
pub fn encode(frame: &Frame) -> Bytes {
    let mut buf = BytesMut::with_capacity(frame.encoded_len());
    // Encoding into a buffer reserved to the exact length cannot fail.
    frame.encode_raw(&mut buf);
    buf.freeze()
}

/// Field tag of `Frame.batch` (field 31, length-delimited) as a varint.
const BATCH_TAG: [u8; 2] = [(31 << 3 | 2) as u8 | 0x80, 0x01];
/// Field tag of `Batch.frames` (field 1, length-delimited).
const FRAMES_TAG: u8 = 1 << 3 | 2;

/// Coalesces already-encoded frames into one encoded `Frame { batch }` without decoding
/// or re-encoding them: each is wrapped as a length-delimited `Batch.frames` entry.
pub fn encode_batch<'a>(frames: impl IntoIterator<Item = &'a [u8]> + Clone) -> Bytes {
    let inner: usize = frames
        .clone()
        .into_iter()
        .map(|f| 1 + prost::encoding::encoded_len_varint(f.len() as u64) + f.len())
        .sum();
    let mut buf = BytesMut::with_capacity(
        BATCH_TAG.len() + prost::encoding::encoded_len_varint(inner as u64) + inner,
    );
    buf.put_slice(&BATCH_TAG);
    prost::encoding::encode_varint(inner as u64, &mut buf);
    for f in frames {
        buf.put_u8(FRAMES_TAG);
        prost::encoding::encode_varint(f.len() as u64, &mut buf);
        buf.put_slice(f);
    }
    buf.freeze()
}

/// Current wall-clock time in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_ids_are_sorted_and_parse_back() {
        assert_eq!(direct_conversation("bob", "alice"), "u:alice:bob");
        assert_eq!(
            parse_conversation("u:alice:bob"),
            Some(ConversationRef::Direct("alice", "bob"))
        );
        assert_eq!(parse_conversation("u:bob:alice"), None);
        assert_eq!(
            parse_conversation("g:team"),
            Some(ConversationRef::Group("team"))
        );
        assert_eq!(parse_conversation("x:1"), None);
        assert_eq!(parse_conversation("u:a"), None);
    }

    #[test]
    fn ids_are_validated() {
        assert!(valid_id("alice-01@x.y_z"));
        assert!(!valid_id(""));
        assert!(!valid_id("a:b"));
        assert!(!valid_id(&"a".repeat(65)));
    }

    #[test]
    fn batch_of_encoded_frames_decodes_as_batch() {
        let a = encode(&frame(1, Body::Ping(Ping { client_time: 5 })));
        let b = encode(&error_frame(2, ErrorCode::BadFrame, "x".repeat(300)));
        let bytes = encode_batch([a.as_ref(), b.as_ref()]);
        let decoded = Frame::decode(bytes).unwrap();
        let Some(Body::Batch(batch)) = decoded.body else {
            panic!("not a batch: {decoded:?}")
        };
        assert_eq!(batch.frames.len(), 2);
        assert_eq!(batch.frames[0], Frame::decode(a).unwrap());
        assert_eq!(batch.frames[1], Frame::decode(b).unwrap());
    }
}
