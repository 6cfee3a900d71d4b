//! The JSON bodies of webhook events, as `im_admin_api::WebhookEvent` (the one
//! contract): one constructor per kind, a fresh event id (UUID v7) per event.

use im_admin_api::{EventMessage, WebhookEvent};

use crate::store::outbox::OutboxSource;

/// An event body before it is stored.
#[derive(Debug, Clone)]
pub(super) struct Body(WebhookEvent);

impl Body {
    fn new(node_id: &str, kind: &str, time: i64) -> Body {
        Body(WebhookEvent {
            id: uuid::Uuid::now_v7().simple().to_string(),
            kind: kind.to_owned(),
            time,
            node_id: node_id.to_owned(),
            ..WebhookEvent::default()
        })
    }

    /// Its event id.
    pub(super) fn id(&self) -> &str {
        &self.0.id
    }

    /// Its kind.
    pub(super) fn kind(&self) -> &str {
        &self.0.kind
    }

    /// The same event under a new id (one per endpoint: ids are unique per delivery).
    pub(super) fn fresh(&self) -> Body {
        let mut b = self.clone();
        b.0.id = uuid::Uuid::now_v7().simple().to_string();
        b
    }

    /// This body with `id` as its event id (a merged event keeps its stored id).
    pub(super) fn with_id(mut self, id: &str) -> Body {
        id.clone_into(&mut self.0.id);
        self
    }

    /// Sets `merged` (message.offline).
    pub(super) fn merged(mut self, n: u64) -> Body {
        self.0.merged = Some(n);
        self
    }

    /// The JSON text.
    pub(super) fn json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(&self.0).unwrap_or_default()
    }
}

/// The name of a `MessageType` wire value.
fn type_name(t: i32) -> &'static str {
    match t {
        0 => "text",
        1 => "image",
        2 => "file",
        3 => "system",
        4 => "recall",
        5 => "edit",
        _ => "other",
    }
}

/// The kind of event a committed message makes (besides `message.offline`).
pub(super) fn kind_of(s: &OutboxSource) -> &'static str {
    match s.msg_type {
        3 if s.conversation_id.starts_with("g:") => "group.changed",
        4 => "message.recalled",
        5 => "message.edited",
        _ => "message.created",
    }
}

/// Whether a message of this type makes `message.offline` events (TEXT, IMAGE, FILE).
pub(super) fn pushes(s: &OutboxSource) -> bool {
    matches!(s.msg_type, 0..=2)
}

/// A message event (`message.created`, `.edited`, `.recalled`, `group.changed`).
pub(super) fn message(node_id: &str, kind: &str, s: &OutboxSource, time: i64) -> Body {
    let mut b = Body::new(node_id, kind, time);
    b.0.message = Some(EventMessage {
        conversation_id: s.conversation_id.clone(),
        seq: s.seq,
        msg_id: s.msg_id.clone(),
        sender: s.sender.clone(),
        msg_type: type_name(s.msg_type).to_owned(),
        ref_msg_id: s.ref_msg_id.clone(),
        send_time: s.send_time,
    });
    b
}

/// `message.offline` for `user`, with their unread count.
pub(super) fn offline(node_id: &str, s: &OutboxSource, user: &str, unread: u64, time: i64) -> Body {
    let mut b = message(node_id, "message.offline", s, time);
    b.0.user_id = user.to_owned();
    b.0.unread = Some(unread);
    b.0.merged = Some(0);
    b
}

/// `user.online` / `user.offline`.
pub(super) fn user(node_id: &str, kind: &str, user: &str, time: i64) -> Body {
    let mut b = Body::new(node_id, kind, time);
    b.0.user_id = user.to_owned();
    b
}

/// `webhook.test` (the admin API's test-fire).
pub(super) fn test(node_id: &str, time: i64) -> Body {
    Body::new(node_id, "webhook.test", time)
}
