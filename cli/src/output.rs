//! Output: text lines or JSON objects (`--json`, one per line), messages and events
//! rendered for both, and the escaping that keeps control characters sent by other
//! users (terminal escapes, bidi overrides, newlines) from reaching the terminal raw.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

use base64::Engine as _;
use im_client::proto::{
    group_op, ChatMessage, GroupEvent, Message as _, MessageState, MessageType,
};
use serde_json::{json, Value};

/// Where results go: stdout, as text or as JSON lines.
#[derive(Debug)]
pub struct Out {
    json: bool,
    stdout: io::Stdout,
}

impl Out {
    /// Stdout, JSON lines when `json`.
    pub fn new(json: bool) -> Out {
        Out {
            json,
            stdout: io::stdout(),
        }
    }

    /// Whether records are JSON.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Writes one record: `text()` as a line, or `json()` as one JSON line (any
    /// control characters left in it escaped); flushed at once for pipes.
    pub fn emit(
        &mut self,
        text: impl FnOnce() -> String,
        json: impl FnOnce() -> Value,
    ) -> io::Result<()> {
        let line = if self.json {
            escape_json(&json().to_string())
        } else {
            text()
        };
        let mut lock = self.stdout.lock();
        writeln!(lock, "{line}")?;
        lock.flush()
    }
}

/// `s` with every control or bidi-formatting character written as an escape (`\n`,
/// `\t`, `\u{1b}`, ...), so it prints on one line and cannot drive the terminal.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Control characters (C0, DEL, C1) and the bidi controls that reorder displayed text.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A serialized JSON line with the characters serde_json leaves raw (DEL, C1, bidi)
/// written as `\uXXXX` (they only occur inside strings, so the JSON stays the same).
fn escape_json(line: &str) -> String {
    if !line.chars().any(unsafe_char) {
        return line.to_owned();
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if unsafe_char(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// A message as one text line: time, conversation, seq, sender, body.
pub fn message_text(m: &ChatMessage) -> String {
    format!(
        "{} {} #{} {}: {}",
        time(m.send_time),
        escape(&m.conversation_id),
        m.seq,
        sender(m),
        body_text(m)
    )
}

/// A message as a JSON object (`kind` "message").
pub fn message_json(m: &ChatMessage) -> Value {
    let mut v = json!({
        "kind": "message",
        "conversation": m.conversation_id,
        "seq": m.seq,
        "msg_id": m.msg_id,
        "sender": m.sender,
        "type": type_name(m.r#type),
        "state": state_name(m.state),
        "time_ms": m.send_time,
    });
    if m.ref_seq > 0 {
        v["ref_seq"] = json!(m.ref_seq);
    }
    if let Some(event) = group_event(m) {
        v["group_event"] = group_event_json(&event);
    } else if let Ok(text) = std::str::from_utf8(&m.payload) {
        v["text"] = json!(text);
    } else {
        v["payload_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(&m.payload));
    }
    v
}

/// `HH:MM:SS` of a time in ms, UTC, with the date.
pub fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

fn sender(m: &ChatMessage) -> Cow<'_, str> {
    if m.sender.is_empty() {
        Cow::Borrowed("*")
    } else {
        escape(&m.sender)
    }
}

/// What a message says, escaped, with its state.
pub fn body_text(m: &ChatMessage) -> String {
    match MessageState::try_from(m.state) {
        Ok(MessageState::Recalled) => return "[recalled]".to_owned(),
        Ok(MessageState::Hidden) => return "[deleted]".to_owned(),
        _ => {}
    }
    let body = match MessageType::try_from(m.r#type) {
        Ok(MessageType::Text) => escape(&String::from_utf8_lossy(&m.payload)).into_owned(),
        Ok(MessageType::Image) => format!("[image, {} bytes]", m.payload.len()),
        Ok(MessageType::File) => format!("[file, {} bytes]", m.payload.len()),
        Ok(MessageType::Recall) => format!("[recalled{}]", ref_of(m)),
        Ok(MessageType::Edit) => format!(
            "[edited{}] {}",
            ref_of(m),
            escape(&String::from_utf8_lossy(&m.payload))
        ),
        Ok(MessageType::System) => match group_event(m) {
            Some(e) => group_event_text(&e),
            None => format!("[system] {}", escape(&String::from_utf8_lossy(&m.payload))),
        },
        Err(_) => format!("[type {}, {} bytes]", m.r#type, m.payload.len()),
    };
    if m.state == MessageState::Edited as i32 {
        format!("{body} [edited]")
    } else {
        body
    }
}

/// ` #SEQ` of the message an event changes (a conversation list's preview has none).
fn ref_of(m: &ChatMessage) -> String {
    if m.ref_seq > 0 {
        format!(" #{}", m.ref_seq)
    } else {
        String::new()
    }
}

/// The membership event a SYSTEM message without a sender carries.
fn group_event(m: &ChatMessage) -> Option<GroupEvent> {
    let system = m.r#type == MessageType::System as i32 && m.sender.is_empty();
    system
        .then(|| GroupEvent::decode(m.payload.clone()).ok())
        .flatten()
}

fn group_event_text(e: &GroupEvent) -> String {
    let actor = escape(&e.actor);
    let mut users = e
        .users
        .iter()
        .map(|u| escape(u))
        .collect::<Vec<_>>()
        .join(", ");
    let more = (e.count as usize).saturating_sub(e.users.len());
    if more > 0 {
        let _ = write!(users, " and {more} more");
    }
    match group_op::Op::try_from(e.op) {
        Ok(group_op::Op::Create) => {
            let others = e.users.iter().filter(|u| **u != e.actor);
            let mut with = others.map(|u| escape(u)).collect::<Vec<_>>().join(", ");
            if more > 0 {
                let _ = write!(with, " and {more} more");
            }
            if with.is_empty() {
                format!("{actor} created the group")
            } else {
                format!("{actor} created the group with {with}")
            }
        }
        Ok(group_op::Op::Join) => format!("{users} joined"),
        Ok(group_op::Op::Leave) => format!("{users} left"),
        Ok(group_op::Op::Add) => format!("{actor} added {users}"),
        Ok(group_op::Op::Remove) => format!("{actor} removed {users}"),
        Ok(group_op::Op::Ban) => format!("{actor} banned {users}"),
        Ok(group_op::Op::Unban) => format!("{actor} unbanned {users}"),
        Ok(group_op::Op::SetRole) => {
            format!("{actor} made {users} {}", role_name(e.role))
        }
        Ok(group_op::Op::Transfer) => format!("{actor} made {users} the owner"),
        Ok(group_op::Op::Dissolve) => format!("{actor} dissolved the group"),
        Ok(group_op::Op::Info) | Err(_) => format!("{actor}: group event {}", e.op),
    }
}

fn group_event_json(e: &GroupEvent) -> Value {
    let mut v = json!({
        "op": group_op::Op::try_from(e.op).map_or("UNKNOWN", |o| o.as_str_name()),
        "actor": e.actor,
        "users": e.users,
        "count": e.count,
    });
    if e.op == group_op::Op::SetRole as i32 {
        v["role"] = json!(role_name(e.role));
    }
    v
}

/// `owner`, `admin`, `member` or `none`.
pub fn role_name(role: i32) -> &'static str {
    match group_op::Role::try_from(role) {
        Ok(group_op::Role::Owner) => "owner",
        Ok(group_op::Role::Admin) => "admin",
        Ok(group_op::Role::Member) => "member",
        _ => "none",
    }
}

fn type_name(t: i32) -> &'static str {
    MessageType::try_from(t).map_or("UNKNOWN", |t| t.as_str_name())
}

fn state_name(s: i32) -> &'static str {
    MessageState::try_from(s).map_or("UNKNOWN", |s| s.as_str_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls_and_bidi() {
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(escape("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(escape("x\u{202e}y\u{9b}"), "x\\u{202e}y\\u{9b}");
        assert_eq!(escape("héllo ✓"), "héllo ✓");
    }

    #[test]
    fn json_lines_carry_no_raw_controls() {
        let m = ChatMessage {
            conversation_id: "u:a:b".into(),
            sender: "a".into(),
            payload: "\u{1b}]0;x\u{7}\u{9b}\u{202e}".into(),
            ..Default::default()
        };
        let line = escape_json(&message_json(&m).to_string());
        assert!(!line.chars().any(unsafe_char), "{line}");
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["text"], "\u{1b}]0;x\u{7}\u{9b}\u{202e}");
    }

    #[test]
    fn renders_group_events_and_states() {
        let event = GroupEvent {
            op: group_op::Op::Add as i32,
            actor: "alice".into(),
            users: vec!["bob".into()],
            count: 3,
            ..Default::default()
        };
        let m = ChatMessage {
            r#type: MessageType::System as i32,
            payload: event.encode_to_vec().into(),
            ..Default::default()
        };
        assert_eq!(body_text(&m), "alice added bob and 2 more");
        let recalled = ChatMessage {
            state: MessageState::Recalled as i32,
            payload: "x".into(),
            ..Default::default()
        };
        assert_eq!(body_text(&recalled), "[recalled]");
    }
}
