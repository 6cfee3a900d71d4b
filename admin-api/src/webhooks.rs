//! Event webhooks: the JSON body of every event the server POSTs to an endpoint
//! ([`WebhookEvent`], one shape with a `kind` and the part that kind fills in), and the
//! admin routes' answers about the endpoints, their queues and the parked events.
//! Shapes, examples and the delivery contract: `docs/webhooks.md`.

use serde::{Deserialize, Serialize};

/// One event as POSTed to an endpoint (the body the signature covers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookEvent {
    /// Unique id (UUID v7, 32 hex digits): the same on every retry of this event, also
    /// sent as `X-IM-Event-Id`; receivers de-duplicate by it.
    pub id: String,
    /// `message.offline`, `message.created`, `message.edited`, `message.recalled`,
    /// `user.online`, `user.offline`, `group.changed` or `webhook.test`.
    pub kind: String,
    /// When the event was made, ms since the epoch.
    pub time: i64,
    /// The node that made it.
    pub node_id: String,
    /// `message.*` and `group.changed`: the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<EventMessage>,
    /// `message.offline`: the offline recipient; `user.*`: the user.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_id: String,
    /// `message.offline`: the recipient's unread messages in the conversation (messages
    /// after their read position, at dispatch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
    /// `message.offline`: how many earlier `message.offline` events for this user were
    /// merged into this one (the collapse window; 0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merged: Option<u64>,
}

/// The message an event is about (ids and kind; never the payload).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventMessage {
    /// Its conversation (`u:a:b` or `g:id`).
    pub conversation_id: String,
    /// Its seq in the conversation.
    pub seq: u64,
    /// Its id.
    pub msg_id: String,
    /// Who sent it.
    pub sender: String,
    /// `text`, `image`, `file`, `system`, `recall` or `edit`.
    pub msg_type: String,
    /// RECALL and EDIT: the id of the message they change.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ref_msg_id: String,
    /// When it was committed, ms since the epoch.
    pub send_time: i64,
}

/// `GET /admin/v1/webhooks`: every configured endpoint and the outbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Webhooks {
    /// The endpoints, in config order.
    pub endpoints: Vec<WebhookEndpoint>,
    /// Committed messages not yet expanded into events.
    pub outbox_pending: u64,
    /// Events stored (queued and parked, all endpoints).
    pub outbox_events: u64,
    /// `webhooks.outbox_max`.
    pub outbox_max: u64,
    /// The outbox is at its bound: new events are stored parked.
    pub outbox_full: bool,
}

/// One endpoint's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookEndpoint {
    /// Its name.
    pub name: String,
    /// Its URL (a password in it shown as `***`).
    pub url: String,
    /// The event kinds it gets.
    pub events: Vec<String>,
    /// Events waiting or retrying.
    pub queued: u64,
    /// Events parked (dead letters).
    pub parked: u64,
    /// Delivered since this node started.
    pub delivered: u64,
    /// Failed attempts since this node started.
    pub failed: u64,
    /// Failed attempts over all attempts in the last minute, 0..1.
    pub failure_rate: f64,
    /// The last error ("" when none), escaped.
    pub last_error: String,
    /// When it happened, ms since the epoch (0: never).
    pub last_error_at: i64,
}

/// `GET /admin/v1/webhooks/parked?endpoint=&limit=`: parked events, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ParkedEvents {
    /// The events.
    pub events: Vec<ParkedEvent>,
    /// More are parked than listed.
    pub more: bool,
}

/// One parked event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ParkedEvent {
    /// Its row id (what redeliver names).
    pub id: i64,
    /// The endpoint.
    pub endpoint: String,
    /// The event id.
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// When it was made, ms since the epoch.
    pub created_ms: i64,
    /// Attempts made.
    pub attempts: u32,
    /// Why it was parked (the last error), escaped.
    pub last_error: String,
}

/// `POST /admin/v1/webhooks/parked/redeliver` body: which parked events to queue again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Redeliver {
    /// Only this endpoint's ("" : every endpoint).
    pub endpoint: String,
    /// Only these row ids (empty: all parked of the endpoint).
    pub ids: Vec<i64>,
}

/// The answer to a redeliver: how many events were queued again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Redelivered {
    /// Events queued again.
    pub queued: u64,
}

/// `POST /admin/v1/webhooks/{name}/test`: a `webhook.test` event sent to the endpoint
/// at once (not queued), and what came back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TestFired {
    /// The event id sent.
    pub event_id: String,
    /// The HTTP status (0: no answer).
    pub status: u16,
    /// The error, when it failed ("" when the endpoint answered 2xx).
    pub error: String,
    /// How long it took, ms.
    pub took_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offline_event_reads_as_documented() {
        let body = r#"{"id":"0190f1c2a0b07d3e9c1a2b3c4d5e6f70","kind":"message.offline",
            "time":1733480000000,"node_id":"n1","user_id":"bob","unread":3,"merged":0,
            "message":{"conversation_id":"u:alice:bob","seq":42,"msg_id":"m1",
            "sender":"alice","msg_type":"text","send_time":1733480000000}}"#;
        let e: WebhookEvent = serde_json::from_str(body).unwrap();
        assert_eq!(e.unread, Some(3));
        assert_eq!(e.message.unwrap().seq, 42);
        let user = WebhookEvent {
            kind: "user.online".into(),
            user_id: "bob".into(),
            ..Default::default()
        };
        let text = serde_json::to_string(&user).unwrap();
        assert!(
            !text.contains("message") && !text.contains("unread"),
            "{text}"
        );
    }
}
