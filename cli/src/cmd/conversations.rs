//! `im conversations` (the list with unread counts, pinned first) and `im read`
//! (move the read cursor).

use im_client::proto::{ConversationKind, ConversationSummary};
use serde_json::json;

use crate::args::{ConversationsArgs, ReadArgs};
use crate::output::{body_text, escape, time, Out};
use crate::session::Session;

/// Largest page asked for.
const PAGE: u32 = 100;

/// Prints up to `--limit` conversations, one line each.
pub async fn list(s: &Session, out: &mut Out, a: ConversationsArgs) -> anyhow::Result<()> {
    let mut after = String::new();
    let mut left = a.limit;
    while left > 0 {
        let page = s
            .call(s.client.list_conversations(after.as_str(), left.min(PAGE)))
            .await?;
        let n = (page.conversations.len() as u32).min(left);
        for c in page.conversations.iter().take(n as usize) {
            out.emit(|| summary_text(c), || summary_json(c))?;
        }
        left -= n;
        if page.next_after.is_empty() || n == 0 {
            break;
        }
        after = page.next_after;
    }
    Ok(())
}

/// `UNREAD  CONVERSATION  flags  last message`.
fn summary_text(c: &ConversationSummary) -> String {
    let flags = match (c.pinned, c.muted) {
        (true, true) => " [pinned, muted]",
        (true, false) => " [pinned]",
        (false, true) => " [muted]",
        (false, false) => "",
    };
    let last = match &c.last_message {
        Some(m) if c.last_seq > 0 => format!(
            "{} #{} {}: {}",
            time(c.last_time),
            c.last_seq,
            if m.sender.is_empty() {
                "*".into()
            } else {
                escape(&m.sender)
            },
            body_text(m)
        ),
        _ => "(no messages)".to_owned(),
    };
    format!(
        "{:>4} unread  {}{flags}  {last}",
        c.unread,
        escape(&c.conversation_id)
    )
}

fn summary_json(c: &ConversationSummary) -> serde_json::Value {
    json!({
        "conversation": c.conversation_id,
        "kind": if c.kind == ConversationKind::Group as i32 { "group" } else { "direct" },
        "name": c.name,
        "size": c.size,
        "unread": c.unread,
        "last_seq": c.last_seq,
        "read_seq": c.read_seq,
        "last_time_ms": c.last_time,
        "last_sender": c.last_message.as_ref().map(|m| m.sender.as_str()),
        "muted": c.muted,
        "pinned": c.pinned,
    })
}

/// Marks the conversation read up to the seq.
pub async fn mark_read(s: &Session, out: &mut Out, a: ReadArgs) -> anyhow::Result<()> {
    s.call(s.client.mark_read(a.conversation.as_str(), a.seq))
        .await?;
    out.emit(
        || format!("read {} up to #{}", escape(&a.conversation), a.seq),
        || json!({"conversation": a.conversation, "read_seq": a.seq}),
    )?;
    Ok(())
}
