//! Hot-path encoding: a `Frame { req_id, send: Send { to_user, payload, client_msg_id } }`
//! written straight into one exactly-sized buffer, so a send costs one allocation (the
//! frame itself) and no intermediate prost structs, strings or payload copies.
//!
//! The payload starts with the send time (microseconds since the run's base instant,
//! little-endian `u64`) so a receiver can measure send-to-deliver latency; the rest is
//! filler up to the requested size. Client message ids are a fixed 32 hex digits: the
//! run id followed by the per-sender message number, unique across runs against the
//! same server (idempotency is keyed on sender and client_msg_id).

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
    let payload_len = payload_len.max(TIMESTAMP_LEN);
    let send_len =
        field_len(to_user.len()) + field_len(payload_len) + field_len(client_msg_id.len());
    let total = 1 + varint_len(req_id) + 1 + varint_len(send_len as u64) + send_len;
    let mut buf = Vec::with_capacity(total);
    buf.push(TAG_REQ_ID);
    put_varint(&mut buf, req_id);
    buf.push(TAG_SEND);
    put_varint(&mut buf, send_len as u64);
    buf.push(TAG_TO_USER);
    put_varint(&mut buf, to_user.len() as u64);
    buf.extend_from_slice(to_user.as_bytes());
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
}
