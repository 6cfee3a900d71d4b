//! `im send`: one text message to a user or a group, printed with its ack (msg_id,
//! seq) once the server has committed it.

use std::io::Read as _;

use im_client::proto::MessageType;
use serde_json::json;

use crate::args::SendArgs;
use crate::failure::{Exit, Failure};
use crate::output::{escape, Out};
use crate::session::Session;

/// Most bytes read from stdin for `im send ... -` (the server has its own, lower limit).
const MAX_STDIN: u64 = 1024 * 1024;

/// Sends the text and prints the ack.
pub async fn send(s: &Session, out: &mut Out, a: SendArgs) -> anyhow::Result<()> {
    let target = super::target(a.peer)?;
    let text = if a.text == ["-"] {
        read_stdin()?
    } else {
        a.text.join(" ")
    };
    let ack = s
        .call(s.client.send(target, MessageType::Text, text, None))
        .await?;
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
