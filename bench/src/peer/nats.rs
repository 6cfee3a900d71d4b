//! The few NATS client protocol operations the peer adapter needs, by hand: CONNECT,
//! SUB, PUB, PING and PONG out; INFO, MSG, PING, PONG, +OK and -ERR in. A [`Decoder`]
//! takes bytes as they come (WebSocket messages may split or join operations) and
//! yields whole operations; a control line longer than [`MAX_LINE`] or a payload larger
//! than [`MAX_PAYLOAD`] is an error, never a panic.

use thiserror::Error;

/// Longest control line accepted (INFO included).
pub const MAX_LINE: usize = 64 * 1024;
/// Largest MSG payload accepted.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// A malformed or oversized operation from the server.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NatsError {
    /// A control line without its CRLF within [`MAX_LINE`] bytes.
    #[error("control line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// A MSG line that does not parse.
    #[error("malformed MSG line: {0}")]
    BadMsg(String),
    /// A MSG payload larger than [`MAX_PAYLOAD`].
    #[error("MSG payload of {0} bytes is larger than the limit")]
    TooLarge(usize),
    /// The payload is not followed by CRLF.
    #[error("MSG payload not followed by CRLF")]
    NoTrailer,
}

/// An operation from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// INFO with its JSON.
    Info(String),
    /// MSG on `subject` for subscription `sid`.
    Msg {
        /// Subject.
        subject: String,
        /// Subscription id.
        sid: String,
        /// Payload.
        payload: Vec<u8>,
    },
    /// PING (answer PONG).
    Ping,
    /// PONG.
    Pong,
    /// +OK (verbose mode only).
    Ok,
    /// -ERR with its text.
    Err(String),
    /// Any other line.
    Other(String),
}

/// CONNECT, non-verbose, named `name`.
pub fn connect(name: &str) -> Vec<u8> {
    let name: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"tls_required\":false,\"name\":\"{name}\",\"lang\":\"rust\",\"version\":\"0.1.0\",\"protocol\":1}}\r\n"
    )
    .into_bytes()
}

/// SUB `subject` as subscription `sid`.
pub fn sub(subject: &str, sid: u64) -> Vec<u8> {
    format!("SUB {subject} {sid}\r\n").into_bytes()
}

/// PUB `payload` on `subject`.
pub fn publish(subject: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("PUB {subject} {}\r\n", payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    out
}

/// PING.
pub fn ping() -> Vec<u8> {
    b"PING\r\n".to_vec()
}

/// PONG.
pub fn pong() -> Vec<u8> {
    b"PONG\r\n".to_vec()
}

/// Reassembles operations from bytes as they arrive.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Appends bytes received from the server.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole operation, `None` if more bytes are needed.
    pub fn next_op(&mut self) -> Result<Option<Op>, NatsError> {
        let Some(eol) = self.buf.windows(2).position(|w| w == b"\r\n") else {
            if self.buf.len() > MAX_LINE {
                return Err(NatsError::LineTooLong);
            }
            return Ok(None);
        };
        if eol > MAX_LINE {
            return Err(NatsError::LineTooLong);
        }
        let line = String::from_utf8_lossy(&self.buf[..eol]).into_owned();
        let (verb, rest) = match line.split_once(' ') {
            Some((v, r)) => (v.to_ascii_uppercase(), r.trim().to_owned()),
            None => (line.trim().to_ascii_uppercase(), String::new()),
        };
        let op = match verb.as_str() {
            "MSG" => {
                let parts: Vec<&str> = rest.split_ascii_whitespace().collect();
                let (subject, sid, len) = match parts.as_slice() {
                    [s, i, n] | [s, i, _, n] => (*s, *i, *n),
                    _ => return Err(NatsError::BadMsg(line)),
                };
                let len: usize = len.parse().map_err(|_| NatsError::BadMsg(line.clone()))?;
                if len > MAX_PAYLOAD {
                    return Err(NatsError::TooLarge(len));
                }
                let start = eol + 2;
                if self.buf.len() < start + len + 2 {
                    return Ok(None);
                }
                if &self.buf[start + len..start + len + 2] != b"\r\n" {
                    return Err(NatsError::NoTrailer);
                }
                let op = Op::Msg {
                    subject: subject.to_owned(),
                    sid: sid.to_owned(),
                    payload: self.buf[start..start + len].to_vec(),
                };
                self.buf.drain(..start + len + 2);
                return Ok(Some(op));
            }
            "INFO" => Op::Info(rest),
            "PING" => Op::Ping,
            "PONG" => Op::Pong,
            "+OK" => Op::Ok,
            "-ERR" => Op::Err(rest),
            _ => Op::Other(line),
        };
        self.buf.drain(..eol + 2);
        Ok(Some(op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Op> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        // Byte by byte: operations split anywhere still come out whole.
        for b in bytes {
            d.push(&[*b]);
            while let Some(op) = d.next_op().unwrap() {
                out.push(op);
            }
        }
        out
    }

    #[test]
    fn client_operations_are_well_formed() {
        assert_eq!(publish("a.b", b"hi\r\n"), b"PUB a.b 4\r\nhi\r\n\r\n");
        assert_eq!(sub("a.>", 3), b"SUB a.> 3\r\n");
        let c = String::from_utf8(connect("bench \"x\"")).unwrap();
        assert!(c.starts_with("CONNECT {") && c.ends_with("}\r\n"), "{c}");
        assert!(c.contains("\"name\":\"benchx\""), "{c}");
        assert!(c.contains("\"verbose\":false"), "{c}");
    }

    #[test]
    fn server_operations_decode_even_when_split() {
        let mut bytes = b"INFO {\"server_id\":\"x\"}\r\nPING\r\n".to_vec();
        bytes.extend(b"MSG a.b 1 6\r\nx\r\nyz!\r\n");
        bytes.extend(b"MSG a.c 2 reply.to 0\r\n\r\n+OK\r\n-ERR 'Stale'\r\npong\r\n");
        assert_eq!(
            decode_all(&bytes),
            vec![
                Op::Info("{\"server_id\":\"x\"}".into()),
                Op::Ping,
                Op::Msg {
                    subject: "a.b".into(),
                    sid: "1".into(),
                    payload: b"x\r\nyz!".to_vec()
                },
                Op::Msg {
                    subject: "a.c".into(),
                    sid: "2".into(),
                    payload: Vec::new()
                },
                Op::Ok,
                Op::Err("'Stale'".into()),
                Op::Pong,
            ]
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut d = Decoder::default();
        d.push(b"MSG a\r\n");
        assert!(matches!(d.next_op(), Err(NatsError::BadMsg(_))));
        let mut d = Decoder::default();
        d.push(b"MSG a 1 zz\r\n");
        assert!(matches!(d.next_op(), Err(NatsError::BadMsg(_))));
        let mut d = Decoder::default();
        d.push(b"MSG a 1 99999999\r\n");
        assert!(matches!(d.next_op(), Err(NatsError::TooLarge(_))));
        let mut d = Decoder::default();
        d.push(b"MSG a 1 2\r\nabcd");
        assert_eq!(d.next_op(), Err(NatsError::NoTrailer));
        let mut d = Decoder::default();
        d.push(&vec![b'x'; MAX_LINE + 1]);
        assert_eq!(d.next_op(), Err(NatsError::LineTooLong));
        let mut d = Decoder::default();
        d.push(b"MSG a 1 5\r\nab");
        assert_eq!(d.next_op(), Ok(None));
    }
}
