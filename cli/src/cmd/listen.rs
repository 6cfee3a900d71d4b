//! `im listen`: everything missed while away (a sync), then messages and events as
//! they arrive, until Ctrl-C or `--count` messages.

use im_client::proto::{Presence, ReadReceipt, Typing};
use im_client::Event;
use serde_json::{json, Value};

use crate::args::ListenArgs;
use crate::failure::{Exit, Failure};
use crate::output::{escape, message_json, message_text, Out};
use crate::session::Session;

/// Prints events until Ctrl-C, the client stopping, or `--count` messages.
pub async fn listen(s: &Session, out: &mut Out, a: ListenArgs) -> anyhow::Result<()> {
    // The sync's messages come back through the event stream, in order, before live ones.
    s.call(s.client.sync()).await?;
    eprintln!(
        "im: listening as {} (Ctrl-C to stop)",
        escape(s.client.user_id())
    );
    let mut messages = 0u64;
    let mut last_loss = None;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            e = s.client.next_event() => e,
        };
        let Some(event) = event else {
            return Err(ended(s, last_loss).into());
        };
        match &event {
            Event::Message(_) => messages += 1,
            Event::Disconnected { reason } => last_loss = Some(reason.clone()),
            _ => {}
        }
        print(out, &event)?;
        if a.count.is_some_and(|n| messages >= n) {
            return Ok(());
        }
    }
}

/// Why the event stream ended: the SDK gave up reconnecting (the login was refused, say
/// for an expired token) after the loss it reported last.
fn ended(s: &Session, last_loss: Option<String>) -> Failure {
    let url = &s.ctx.url;
    match last_loss {
        Some(reason) => match reason.strip_prefix("login refused: ") {
            Some(why) => Failure::new(
                Exit::Auth,
                format!("the server at {url} refused the login: {why}"),
            ),
            None => Failure::new(
                Exit::Unreachable,
                format!("the connection to {url} ended: {reason}"),
            ),
        },
        None => s.ctx.request_failed(im_client::ClientError::Disconnected),
    }
}

/// One event: a line on stdout (connection changes go to stderr in text mode).
fn print(out: &mut Out, event: &Event) -> std::io::Result<()> {
    match event {
        Event::Message(m) => out.emit(|| message_text(m), || message_json(m)),
        Event::Recalled(m) | Event::Edited(m) => {
            let kind = if matches!(event, Event::Recalled(_)) {
                "recalled"
            } else {
                "edited"
            };
            out.emit(
                || message_text(m),
                || {
                    let mut v = message_json(m);
                    v["kind"] = json!(kind);
                    v
                },
            )
        }
        Event::ReadReceipt(r) => out.emit(|| receipt_text(r), || receipt_json(r)),
        Event::Typing(t) => out.emit(|| typing_text(t), || typing_json(t)),
        Event::Presence(p) => out.emit(|| presence_text(p), || presence_json(p)),
        Event::Disconnected { reason } => status(
            out,
            format!("connection lost ({})", escape(reason)),
            json!({"kind": "disconnected", "reason": reason}),
        ),
        Event::Reconnected { node_id } => status(
            out,
            format!("reconnected (node {})", escape(node_id)),
            json!({"kind": "reconnected", "node": node_id}),
        ),
    }
}

/// A connection change: stderr in text mode (stdout stays messages), a record in JSON.
fn status(out: &mut Out, text: String, json: Value) -> std::io::Result<()> {
    if out.is_json() {
        out.emit(|| text, || json)
    } else {
        eprintln!("im: {text}");
        Ok(())
    }
}

fn receipt_text(r: &ReadReceipt) -> String {
    let who = if r.user_id.is_empty() {
        format!("{} members", r.read_count)
    } else {
        escape(&r.user_id).into_owned()
    };
    format!(
        "* {who} read {} up to #{}",
        escape(&r.conversation_id),
        r.seq
    )
}

fn receipt_json(r: &ReadReceipt) -> Value {
    json!({
        "kind": "read",
        "conversation": r.conversation_id,
        "user": r.user_id,
        "seq": r.seq,
        "read_count": r.read_count,
        "time_ms": r.read_time,
    })
}

fn typing_text(t: &Typing) -> String {
    let what = if t.typing {
        "is typing"
    } else {
        "stopped typing"
    };
    format!(
        "* {} {what} in {}",
        escape(&t.user_id),
        escape(&t.conversation_id)
    )
}

fn typing_json(t: &Typing) -> Value {
    json!({"kind": "typing", "conversation": t.conversation_id, "user": t.user_id, "typing": t.typing})
}

fn presence_text(p: &Presence) -> String {
    let state = if p.online { "online" } else { "offline" };
    format!("* {} is {state}", escape(&p.user_id))
}

fn presence_json(p: &Presence) -> Value {
    json!({"kind": "presence", "user": p.user_id, "online": p.online, "last_seen_ms": p.last_seen})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_name_the_reader_or_the_count() {
        let r = ReadReceipt {
            conversation_id: "g:t".into(),
            seq: 4,
            read_count: 3,
            ..Default::default()
        };
        assert_eq!(receipt_text(&r), "* 3 members read g:t up to #4");
    }
}
