//! The before-send hook's contract: the JSON the server POSTs to the application's backend
//! for each Send ([`BeforeSendRequest`]) and the answer it expects back
//! ([`BeforeSendAnswer`]: allow, reject with a reason, or replace the payload), plus the
//! hook's state as the overview shows it ([`HookStatus`]). Shapes and examples:
//! `docs/before-send.md`.

use serde::{Deserialize, Serialize};

/// Longest rejection reason passed on to the sender, in bytes (longer ones are cut at a
/// character boundary).
pub const MAX_REASON_BYTES: usize = 256;

/// What the server asks the hook about one Send (POST body, `application/json`, signed
/// with the `X-IM-*` headers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BeforeSendRequest {
    /// The id the message will have if it is stored (32 hex digits).
    pub msg_id: String,
    /// The conversation (`u:<a>:<b>` or `g:<group>`).
    pub conversation_id: String,
    /// The sending user.
    pub sender: String,
    /// The sender's device (`Login.device_id`, `default` when empty).
    pub device_id: String,
    /// The recipient of a one-to-one message (absent for a group message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_user: Option<String>,
    /// The group of a group message (absent for a one-to-one message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    /// The message type: `text`, `image` or `file`.
    #[serde(rename = "type")]
    pub msg_type: String,
    /// The client's id of the send (idempotency key; a retry carries the same one).
    pub client_msg_id: String,
    /// The payload, base64 (standard alphabet, padded).
    pub payload_b64: String,
    /// The payload as text, when it is valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// When the server received the Send (Unix milliseconds).
    pub received_at_ms: u64,
}

/// What the hook decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BeforeSendAction {
    /// Store and deliver the message as sent.
    #[default]
    Allow,
    /// Refuse it: the sender gets `REJECTED_BY_HOOK` with the reason; nothing is stored.
    Reject,
    /// Store and deliver `payload_b64` (or `text`) instead of the sent payload.
    Replace,
}

/// The hook's answer (HTTP 200, `application/json`). Fields the server does not know are
/// ignored, so a backend may add its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeforeSendAnswer {
    /// The decision.
    pub action: BeforeSendAction,
    /// `reject`: why, shown to the sender (at most [`MAX_REASON_BYTES`] are passed on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `replace`: the new payload, base64 (wins over `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_b64: Option<String>,
    /// `replace`: the new payload as text (UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// One configured hook as the overview shows it (`overview.hooks[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HookStatus {
    /// Which hook (`before_send`).
    pub hook: String,
    /// The endpoint (scheme, host and port; no path, no credentials).
    pub endpoint: String,
    /// What a failed call means for the message: `fail_open` or `fail_closed`.
    pub on_error: String,
    /// The circuit breaker: `closed` (called), `open` (not called until the cool-down
    /// ends) or `half_open` (one probe call decides).
    pub breaker: String,
    /// Times the breaker opened since start.
    pub breaker_opened_total: u64,
    /// Calls made since start.
    pub calls_total: u64,
    /// Calls that failed (timeout, connection, status, bad answer) since start.
    pub failures_total: u64,
    /// Sends that were not asked because the breaker was open or too many calls were in
    /// flight (handled by `on_error`) since start.
    pub skipped_total: u64,
    /// Calls in flight now.
    pub in_flight: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_as_documented() {
        let a: BeforeSendAnswer = serde_json::from_str(r#"{"action":"allow"}"#).unwrap();
        assert_eq!(a.action, BeforeSendAction::Allow);
        let a: BeforeSendAnswer =
            serde_json::from_str(r#"{"action":"reject","reason":"spam","extra":1}"#).unwrap();
        assert_eq!(a.action, BeforeSendAction::Reject);
        assert_eq!(a.reason.as_deref(), Some("spam"));
        let a: BeforeSendAnswer =
            serde_json::from_str(r#"{"action":"replace","text":"***"}"#).unwrap();
        assert_eq!(a.text.as_deref(), Some("***"));
        assert!(serde_json::from_str::<BeforeSendAnswer>(r#"{"action":"maybe"}"#).is_err());
        assert!(serde_json::from_str::<BeforeSendAnswer>(r#"{}"#).is_err());
    }

    #[test]
    fn a_request_names_its_type_field_type() {
        let r = BeforeSendRequest {
            msg_type: "text".into(),
            to_user: Some("bob".into()),
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["type"], "text");
        assert_eq!(v["to_user"], "bob");
        assert!(v.get("group_id").is_none());
    }
}
