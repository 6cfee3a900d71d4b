//! `ClientError`: every way a raw-connection or SDK call can fail.

use im_proto::ErrorCode;
use tokio_tungstenite::tungstenite;

/// Errors returned by [`crate::RawConn`] and [`crate::Client`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// TCP or WebSocket failure (connect, handshake, read, write).
    #[error("websocket: {0}")]
    WebSocket(#[source] Box<tungstenite::Error>),
    /// The server sent binary that does not decode as a `Frame`.
    #[error("undecodable frame from server: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The server broke the protocol (a text message, or a reply of the wrong kind).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The server answered the request with an `Error` frame.
    #[error("server error {code:?}: {message} (retry after {retry_after_ms} ms)")]
    Server {
        /// The error code (`Unspecified` when the server sent a value this SDK does not know).
        code: ErrorCode,
        /// Human-readable message from the server.
        message: String,
        /// Hint for when to retry (non-zero with `Overloaded`).
        retry_after_ms: u32,
    },
    /// No answer within the allowed time.
    #[error("timed out")]
    Timeout,
    /// The WebSocket closed while a raw-connection call waited for an answer.
    #[error("connection closed (code {code:?}): {reason}")]
    Closed {
        /// The close code, when the server sent a close frame.
        code: Option<u16>,
        /// The close reason (or the transport error text).
        reason: String,
    },
    /// The client lost its connection while the request was in flight, or has stopped.
    #[error("disconnected")]
    Disconnected,
    /// No `route_urls` seed answered `GET /v1/route`.
    #[error("route: {0}")]
    Route(String),
    /// The TLS settings could not be built (a bad CA file).
    #[error("tls: {0}")]
    Tls(String),
}

impl ClientError {
    /// Builds `ClientError::Server` from a received `Error` frame body.
    pub fn from_server(e: im_proto::Error) -> Self {
        ClientError::Server {
            code: ErrorCode::try_from(e.code).unwrap_or(ErrorCode::Unspecified),
            message: e.message,
            retry_after_ms: e.retry_after_ms,
        }
    }

    /// The server error code, when this is `ClientError::Server`.
    pub fn server_code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<tungstenite::Error> for ClientError {
    fn from(e: tungstenite::Error) -> Self {
        ClientError::WebSocket(Box::new(e))
    }
}
