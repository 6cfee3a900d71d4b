//! The few MQTT 3.1.1 packets the peer adapter needs, by hand: CONNECT, SUBSCRIBE,
//! PUBLISH (QoS 0 and 1), PUBACK, PINGREQ and DISCONNECT out; CONNACK, SUBACK, PUBLISH,
//! PUBACK and PINGRESP in. A [`Decoder`] takes bytes as they come (WebSocket messages
//! may split or join packets) and yields whole packets; anything malformed or larger
//! than [`MAX_PACKET`] is an error, never a panic.

use thiserror::Error;

/// Largest packet the decoder accepts (remaining length), 1 MiB.
pub const MAX_PACKET: usize = 1 << 20;

/// A malformed or oversized packet from the broker.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MqttError {
    /// The remaining-length varint runs past four bytes.
    #[error("remaining length is longer than 4 bytes")]
    BadLength,
    /// The packet is larger than [`MAX_PACKET`].
    #[error("packet of {0} bytes is larger than the limit")]
    TooLarge(usize),
    /// The packet's body is shorter than its fields.
    #[error("truncated {0} packet")]
    Truncated(&'static str),
    /// A topic name is not UTF-8.
    #[error("topic is not UTF-8")]
    BadTopic,
}

/// A packet from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNACK with its return code (0: accepted).
    ConnAck {
        /// Return code.
        code: u8,
    },
    /// PUBLISH of `payload` on `topic`; `id` is set for QoS 1 and 2.
    Publish {
        /// QoS (0..2).
        qos: u8,
        /// Topic name.
        topic: String,
        /// Packet identifier (QoS > 0).
        id: Option<u16>,
        /// Application payload.
        payload: Vec<u8>,
    },
    /// PUBACK of packet `id`.
    PubAck {
        /// Packet identifier.
        id: u16,
    },
    /// SUBACK of packet `id` with one return code per topic filter (0x80: refused).
    SubAck {
        /// Packet identifier.
        id: u16,
        /// Granted QoS per filter, or 0x80.
        codes: Vec<u8>,
    },
    /// PINGRESP.
    PingResp,
    /// Any other packet type (the high nibble of the first byte).
    Other(u8),
}

fn put_len(buf: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        buf.push(b);
        if n == 0 {
            break;
        }
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u16).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(first);
    put_len(&mut out, body.len());
    out.extend_from_slice(body);
    out
}

/// CONNECT with a clean session, `client_id` and `keepalive` seconds (0: off).
pub fn connect(client_id: &str, keepalive: u16) -> Vec<u8> {
    let mut body = Vec::with_capacity(12 + client_id.len());
    put_str(&mut body, "MQTT");
    body.push(4); // protocol level 3.1.1
    body.push(0x02); // clean session
    body.extend_from_slice(&keepalive.to_be_bytes());
    put_str(&mut body, client_id);
    packet(0x10, &body)
}

/// SUBSCRIBE packet `id` to one `filter` at `qos`.
pub fn subscribe(id: u16, filter: &str, qos: u8) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + filter.len());
    body.extend_from_slice(&id.to_be_bytes());
    put_str(&mut body, filter);
    body.push(qos);
    packet(0x82, &body)
}

/// PUBLISH `payload` on `topic`: QoS 0 when `id` is `None`, else QoS 1 with that id.
pub fn publish(topic: &str, id: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + topic.len() + payload.len());
    put_str(&mut body, topic);
    if let Some(id) = id {
        body.extend_from_slice(&id.to_be_bytes());
    }
    body.extend_from_slice(payload);
    packet(if id.is_some() { 0x32 } else { 0x30 }, &body)
}

/// PUBACK of packet `id`.
pub fn puback(id: u16) -> Vec<u8> {
    let [a, b] = id.to_be_bytes();
    vec![0x40, 2, a, b]
}

/// PINGREQ.
pub fn pingreq() -> Vec<u8> {
    vec![0xc0, 0]
}

/// DISCONNECT.
pub fn disconnect() -> Vec<u8> {
    vec![0xe0, 0]
}

/// Reassembles packets from bytes as they arrive.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize, what: &'static str) -> Result<u16, MqttError> {
    match b.get(at..at + 2) {
        Some(&[x, y]) => Ok(u16::from_be_bytes([x, y])),
        _ => Err(MqttError::Truncated(what)),
    }
}

impl Decoder {
    /// Appends bytes received from the broker.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole packet, `None` if more bytes are needed.
    pub fn next_packet(&mut self) -> Result<Option<Packet>, MqttError> {
        let Some(&first) = self.buf.first() else {
            return Ok(None);
        };
        let (mut len, mut mult, mut i) = (0usize, 1usize, 1usize);
        loop {
            let Some(&b) = self.buf.get(i) else {
                return Ok(None);
            };
            len += (b & 0x7f) as usize * mult;
            i += 1;
            if b & 0x80 == 0 {
                break;
            }
            if i > 4 {
                return Err(MqttError::BadLength);
            }
            mult *= 128;
        }
        if len > MAX_PACKET {
            return Err(MqttError::TooLarge(len));
        }
        if self.buf.len() < i + len {
            return Ok(None);
        }
        let body = &self.buf[i..i + len];
        let p = match first >> 4 {
            2 => Packet::ConnAck {
                code: *body.get(1).ok_or(MqttError::Truncated("CONNACK"))?,
            },
            3 => {
                let qos = (first >> 1) & 3;
                let tlen = u16_at(body, 0, "PUBLISH")? as usize;
                let topic = body
                    .get(2..2 + tlen)
                    .ok_or(MqttError::Truncated("PUBLISH"))?;
                let topic = std::str::from_utf8(topic)
                    .map_err(|_| MqttError::BadTopic)?
                    .to_owned();
                let mut at = 2 + tlen;
                let id = if qos > 0 {
                    at += 2;
                    Some(u16_at(body, at - 2, "PUBLISH")?)
                } else {
                    None
                };
                Packet::Publish {
                    qos,
                    topic,
                    id,
                    payload: body[at..].to_vec(),
                }
            }
            4 => Packet::PubAck {
                id: u16_at(body, 0, "PUBACK")?,
            },
            9 => Packet::SubAck {
                id: u16_at(body, 0, "SUBACK")?,
                codes: body[2..].to_vec(),
            },
            13 => Packet::PingResp,
            t => Packet::Other(t),
        };
        self.buf.drain(..i + len);
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Packet> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        // Byte by byte: packets split anywhere still come out whole.
        for b in bytes {
            d.push(&[*b]);
            while let Some(p) = d.next_packet().unwrap() {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn connect_matches_the_spec_layout() {
        assert_eq!(
            connect("ab", 30),
            [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 30, 0, 2, b'a', b'b']
        );
        assert_eq!(subscribe(7, "t", 1), [0x82, 6, 0, 7, 0, 1, b't', 1]);
        assert_eq!(puback(0x0102), [0x40, 2, 1, 2]);
    }

    #[test]
    fn publishes_round_trip_through_the_decoder() {
        let mut bytes = publish("a/b", None, b"hello");
        bytes.extend(publish("a/c", Some(9), &[0u8; 200]));
        bytes.extend([0x20, 2, 0, 5, 0x40, 2, 0, 9, 0x90, 3, 0, 7, 0x80, 0xd0, 0]);
        let got = decode_all(&bytes);
        assert_eq!(
            got,
            vec![
                Packet::Publish {
                    qos: 0,
                    topic: "a/b".into(),
                    id: None,
                    payload: b"hello".to_vec()
                },
                Packet::Publish {
                    qos: 1,
                    topic: "a/c".into(),
                    id: Some(9),
                    payload: vec![0; 200]
                },
                Packet::ConnAck { code: 5 },
                Packet::PubAck { id: 9 },
                Packet::SubAck {
                    id: 7,
                    codes: vec![0x80]
                },
                Packet::PingResp,
            ]
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut d = Decoder::default();
        d.push(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert_eq!(d.next_packet(), Err(MqttError::BadLength));
        let mut d = Decoder::default();
        d.push(&[0x30, 0xff, 0xff, 0x7f]);
        assert!(matches!(d.next_packet(), Err(MqttError::TooLarge(_))));
        let mut d = Decoder::default();
        d.push(&[0x30, 3, 0, 9, b'x']);
        assert_eq!(d.next_packet(), Err(MqttError::Truncated("PUBLISH")));
        let mut d = Decoder::default();
        d.push(&[0x40, 1, 0]);
        assert_eq!(d.next_packet(), Err(MqttError::Truncated("PUBACK")));
        let mut d = Decoder::default();
        d.push(&[0x30, 4]);
        assert_eq!(d.next_packet(), Ok(None));
    }
}
