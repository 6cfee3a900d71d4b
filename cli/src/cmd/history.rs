//! `im history`: one page of a conversation, oldest first, with the `--before` of the
//! next (older) page on stderr when there is one.

use crate::args::HistoryArgs;
use crate::output::{message_json, message_text, Out};
use crate::session::Session;

/// Prints one page of history.
pub async fn history(s: &Session, out: &mut Out, a: HistoryArgs) -> anyhow::Result<()> {
    let conversation = super::target(a.peer)?.conversation_id(s.client.user_id());
    let before = a.before.unwrap_or(0);
    let page = s
        .call(s.client.history(conversation.as_str(), before, a.limit))
        .await?;
    // The server answers newest first; a terminal reads oldest first.
    for m in page.messages.iter().rev() {
        out.emit(|| message_text(m), || message_json(m))?;
    }
    if let (true, Some(oldest)) = (page.more, page.messages.last()) {
        eprintln!("im: older messages: --before {}", oldest.seq);
    }
    Ok(())
}
