//! `im send`, `im recall`, `im edit`: what goes into a conversation, each printed with
//! its ack (msg_id, seq) once the server has committed it.

use std::io::Read as _;

use im_client::proto::{MessageType, SendAck};
use serde_json::json;

use crate::args::{EditArgs, RecallArgs, SendArgs};
use crate::failure::{Exit, Failure};
use crate::output::{escape, Out};
use crate::session::Session;

/// Most bytes read from stdin for `im send ... -` (the server has its own, lower limit).
const MAX_STDIN: u64 = 1024 * 1024;

/// Sends the text and prints the ack.
pub async fn send(s: &Session, out: &mut Out, a: SendArgs) -> anyhow::Result<()> {
    let target = super::target(a.peer)?;
    let text = text_of(a.text)?;
    let ack = s
        .call(s.client.send(target, MessageType::Text, text, None))
        .await?;
    print_ack(out, &ack)
}

/// Recalls a message; prints the ack of the RECALL event.
pub async fn recall(s: &Session, out: &mut Out, a: RecallArgs) -> anyhow::Result<()> {
    let ack = s
        .call(s.client.recall(a.conversation.as_str(), a.seq, ""))
        .await?;
    print_ack(out, &ack)
}

/// Edits a message; prints the ack of the EDIT event.
pub async fn edit(s: &Session, out: &mut Out, a: EditArgs) -> anyhow::Result<()> {
    let text = text_of(a.text)?;
    let ack = s
        .call(s.client.edit(a.conversation.as_str(), a.seq, "", text))
        .await?;
    print_ack(out, &ack)
}

/// The words joined with spaces, or stdin for a lone `-`.
fn text_of(words: Vec<String>) -> Result<String, Failure> {
    if words == ["-"] {
        read_stdin()
    } else {
        Ok(words.join(" "))
    }
}

/// `msg_id=ID seq=N conversation=C`.
fn print_ack(out: &mut Out, ack: &SendAck) -> anyhow::Result<()> {
    out.emit(
        || {
            format!(
                "msg_id={} seq={} conversation={}{}",
                escape(&ack.msg_id),
                ack.seq,
                escape(&ack.conversation_id),
                if ack.duplicate { " (duplicate)" } else { "" }
            )
        },
        || {
            json!({
                "msg_id": ack.msg_id,
                "seq": ack.seq,
                "conversation": ack.conversation_id,
                "server_time_ms": ack.server_time,
                "duplicate": ack.duplicate,
            })
        },
    )?;
    Ok(())
}

/// The message from stdin, without one trailing newline.
fn read_stdin() -> Result<String, Failure> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(MAX_STDIN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::new(Exit::Usage, format!("reading the message from stdin: {e}")))?;
    if bytes.len() as u64 > MAX_STDIN {
        return Err(Failure::new(
            Exit::Usage,
            format!("the message on stdin is larger than {MAX_STDIN} bytes"),
        ));
    }
    let mut text = String::from_utf8(bytes)
        .map_err(|_| Failure::new(Exit::Usage, "the message on stdin is not UTF-8 text"))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}
