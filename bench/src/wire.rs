//! Hot-path encoding: a `Frame { req_id, send: Send { to_user | group_id, type, payload,
//! client_msg_id } }` written straight into one exactly-sized buffer, so a send costs one
//! allocation (the frame itself) and no intermediate prost structs, strings or payload
//! copies. Also the malformed frames of the chaos scenario ([`bad_frame`]).
//!
//! The payload starts with the send time (microseconds since the run's base instant,
//! little-endian `u64`) so a receiver can measure send-to-deliver latency; the rest is
//! filler up to the requested size. Client message ids are a fixed 32 hex digits: the
//! run id followed by the per-sender message number, unique across runs against the
//! same server (idempotency is keyed on sender and client_msg_id).

use im_proto::MessageType;

/// Bytes at the start of a payload that carry the send timestamp.
pub const TIMESTAMP_LEN: usize = 8;
/// Length of a client message id made by [`client_msg_id`].
pub const CLIENT_MSG_ID_LEN: usize = 32;

/// Tag of `Frame.req_id` (field 1, varint).
const TAG_REQ_ID: u8 = 1 << 3;
/// Tag of `Frame.send` (field 12, length-delimited).
const TAG_SEND: u8 = 12 << 3 | 2;
/// Tag of `Send.to_user` (field 1, length-delimited).
const TAG_TO_USER: u8 = 1 << 3 | 2;
/// Tag of `Send.group_id` (field 2, length-delimited).
const TAG_GROUP_ID: u8 = 2 << 3 | 2;
/// Tag of `Send.type` (field 3, varint).
const TAG_TYPE: u8 = 3 << 3;
/// Tag of `Send.payload` (field 4, length-delimited).
const TAG_PAYLOAD: u8 = 4 << 3 | 2;
/// Tag of `Send.client_msg_id` (field 5, length-delimited).
const TAG_CLIENT_MSG_ID: u8 = 5 << 3 | 2;
/// Byte the payload is padded with after the timestamp.
const FILLER: u8 = b'x';

/// Encoded length of `v` as a protobuf varint.
pub fn varint_len(v: u64) -> usize {
    // 1 byte per 7 significant bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Length of a length-delimited field with a one-byte tag and `len` bytes of content.
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The client message id for message `n` of a run: 16 hex digits of `run_id`, then 16
/// of `n`.
pub fn client_msg_id(run_id: u64, n: u64) -> [u8; CLIENT_MSG_ID_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; CLIENT_MSG_ID_LEN];
    for (i, slot) in out.iter_mut().enumerate() {
        let (word, pos) = if i < 16 { (run_id, i) } else { (n, i - 16) };
        *slot = HEX[((word >> (60 - 4 * pos)) & 0xf) as usize];
    }
    out
}

/// Who a Send goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest<'a> {
    /// A one-to-one message to this user.
    User(&'a str),
    /// A group message.
    Group(&'a str),
}

/// Encodes the `Frame` carrying a one-to-one `Send` of a TEXT message to `to_user`:
/// `payload_len` bytes (at least [`TIMESTAMP_LEN`]; smaller values are raised to it)
/// starting with `sent_us`, and the given client message id.
pub fn encode_send(
    req_id: u64,
    to_user: &str,
    client_msg_id: &[u8],
    payload_len: usize,
    sent_us: u64,
) -> Vec<u8> {
    encode_send_to(
        req_id,
        Dest::User(to_user),
        MessageType::Text,
        client_msg_id,
        payload_len,
        sent_us,
    )
}

/// Encodes a `Send` frame to `dest` of type `msg_type`; the payload is as in
/// [`encode_send`].
pub fn encode_send_to(
    req_id: u64,
    dest: Dest<'_>,
    msg_type: MessageType,
    client_msg_id: &[u8],
    payload_len: usize,
    sent_us: u64,
) -> Vec<u8> {
    let payload_len = payload_len.max(TIMESTAMP_LEN);
    let (dest_tag, dest_id) = match dest {
        Dest::User(u) => (TAG_TO_USER, u),
        Dest::Group(g) => (TAG_GROUP_ID, g),
    };
    let type_value = msg_type as i32 as u64;
    // proto3 leaves the default (TEXT = 0) out.
    let type_len = if type_value == 0 {
        0
    } else {
        1 + varint_len(type_value)
    };
    let send_len = field_len(dest_id.len())
        + type_len
        + field_len(payload_len)
        + field_len(client_msg_id.len());
    let total = 1 + varint_len(req_id) + 1 + varint_len(send_len as u64) + send_len;
    let mut buf = Vec::with_capacity(total);
    buf.push(TAG_REQ_ID);
    put_varint(&mut buf, req_id);
    buf.push(TAG_SEND);
    put_varint(&mut buf, send_len as u64);
    buf.push(dest_tag);
    put_varint(&mut buf, dest_id.len() as u64);
    buf.extend_from_slice(dest_id.as_bytes());
    if type_value != 0 {
        buf.push(TAG_TYPE);
        put_varint(&mut buf, type_value);
    }
    buf.push(TAG_PAYLOAD);
    put_varint(&mut buf, payload_len as u64);
    buf.extend_from_slice(&sent_us.to_le_bytes());
    buf.resize(buf.len() + payload_len - TIMESTAMP_LEN, FILLER);
    buf.push(TAG_CLIENT_MSG_ID);
    put_varint(&mut buf, client_msg_id.len() as u64);
    buf.extend_from_slice(client_msg_id);
    debug_assert_eq!(buf.len(), total);
    buf
}

/// The kinds of malformed frame the chaos scenario sends. Every one must be answered
/// with `Error BAD_FRAME` and leave the connection working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFrame {
    /// A field key with wire type 7, which does not exist: does not decode.
    InvalidWireType,
    /// A real Send frame cut in half: a length prefix runs past the end.
    Truncated,
    /// A varint longer than 10 bytes: does not decode.
    VarintOverflow,
    /// A Frame with a req_id and no body: decodes, breaks the protocol.
    NoBody,
    /// A Send with neither to_user nor group_id: decodes, fails validation.
    NoTarget,
}

impl BadFrame {
    /// Every kind, in the order the chaos scenario cycles through them.
    pub const ALL: [BadFrame; 5] = [
        BadFrame::InvalidWireType,
        BadFrame::Truncated,
        BadFrame::VarintOverflow,
        BadFrame::NoBody,
        BadFrame::NoTarget,
    ];

    /// Whether the server can read the frame's req_id (and echoes it on the Error);
    /// undecodable frames are answered with req_id 0.
    pub fn echoes_req_id(self) -> bool {
        matches!(self, BadFrame::NoBody | BadFrame::NoTarget)
    }
}

/// The bytes of a malformed frame of `kind` (with `req_id` where the kind has one).
pub fn bad_frame(kind: BadFrame, req_id: u64) -> Vec<u8> {
    match kind {
        BadFrame::InvalidWireType => vec![1 << 3 | 7, 0],
        BadFrame::Truncated => {
            let mut whole = encode_send(req_id, "nobody", &[b'0'; CLIENT_MSG_ID_LEN], 64, 0);
            whole.truncate(whole.len() / 2);
            whole
        }
        BadFrame::VarintOverflow => {
            let mut b = vec![TAG_REQ_ID];
            b.extend_from_slice(&[0xff; 11]);
            b.push(0x01);
            b
        }
        BadFrame::NoBody => {
            let mut b = vec![TAG_REQ_ID];
            put_varint(&mut b, req_id);
            b
        }
        BadFrame::NoTarget => {
            let payload = [FILLER; 16];
            let send_len = field_len(payload.len());
            let mut b = vec![TAG_REQ_ID];
            put_varint(&mut b, req_id);
            b.push(TAG_SEND);
            put_varint(&mut b, send_len as u64);
            b.push(TAG_PAYLOAD);
            put_varint(&mut b, payload.len() as u64);
            b.extend_from_slice(&payload);
            b
        }
    }
}

/// The send timestamp a payload made by [`encode_send`] starts with, if it is long enough.
pub fn payload_timestamp(payload: &[u8]) -> Option<u64> {
    let head: [u8; TIMESTAMP_LEN] = payload.get(..TIMESTAMP_LEN)?.try_into().ok()?;
    Some(u64::from_le_bytes(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use im_proto::{send, Body, Frame, Message as _, MessageType};

    #[test]
    fn varint_lengths_match_prost() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
            assert_eq!(prost::encoding::encoded_len_varint(v), varint_len(v), "{v}");
        }
    }

    #[test]
    fn encoded_send_decodes_as_the_contract_frame() {
        let id = client_msg_id(0xdead_beef, 300);
        assert_eq!(&id, b"00000000deadbeef000000000000012c");
        for payload_len in [0usize, 8, 100, 200, 70_000] {
            let bytes = encode_send(300, "r17", &id, payload_len, 123_456_789);
            let f = Frame::decode(bytes.as_slice()).unwrap();
            assert_eq!(f.req_id, 300);
            let Some(Body::Send(s)) = f.body else {
                panic!("not a send: {f:?}")
            };
            assert_eq!(s.target, Some(send::Target::ToUser("r17".into())));
            assert_eq!(s.r#type, MessageType::Text as i32);
            assert_eq!(s.client_msg_id.as_bytes(), id);
            assert_eq!(s.payload.len(), payload_len.max(TIMESTAMP_LEN));
            assert_eq!(payload_timestamp(&s.payload), Some(123_456_789));
        }
        assert_eq!(payload_timestamp(b"short"), None);
    }

    #[test]
    fn group_and_typed_sends_decode() {
        let id = client_msg_id(7, 9);
        for (dest, ty) in [
            (Dest::Group("g-1"), MessageType::Text),
            (Dest::User("bob"), MessageType::Image),
            (Dest::Group("g-2"), MessageType::File),
        ] {
            let bytes = encode_send_to(u64::MAX, dest, ty, &id, 50_000, 42);
            let f = Frame::decode(bytes.as_slice()).unwrap();
            assert_eq!(f.req_id, u64::MAX);
            let Some(Body::Send(s)) = f.body else {
                panic!("not a send: {f:?}")
            };
            let want = match dest {
                Dest::User(u) => send::Target::ToUser(u.into()),
                Dest::Group(g) => send::Target::GroupId(g.into()),
            };
            assert_eq!(s.target, Some(want));
            assert_eq!(s.r#type, ty as i32);
            assert_eq!(s.payload.len(), 50_000);
            assert_eq!(payload_timestamp(&s.payload), Some(42));
        }
    }

    #[test]
    fn bad_frames_are_bad_in_the_intended_way() {
        for kind in BadFrame::ALL {
            let bytes = bad_frame(kind, 1 << 62);
            match Frame::decode(bytes.as_slice()) {
                Err(_) => assert!(!kind.echoes_req_id(), "{kind:?} should decode"),
                Ok(f) => {
                    assert!(kind.echoes_req_id(), "{kind:?} decoded: {f:?}");
                    assert_eq!(f.req_id, 1 << 62);
                    match f.body {
                        None => assert_eq!(kind, BadFrame::NoBody),
                        Some(Body::Send(s)) => {
                            assert_eq!(kind, BadFrame::NoTarget);
                            assert_eq!(s.target, None);
                        }
                        other => panic!("{kind:?}: {other:?}"),
                    }
                }
            }
        }
    }
}
