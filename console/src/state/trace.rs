//! Trace: the message whose stage timeline the Trace view shows (typed with `/`, or
//! taken with `m` from the Logs view's live tail) and the node's answer.

use super::*;
use crate::api::{ApiError, LogTailLine, MessageTrace};

/// Where the Trace view's request stands.
#[derive(Debug, Clone)]
pub enum TraceStatus {
    /// Asked for; no answer yet.
    Loading,
    /// The merged timeline.
    Done(MessageTrace),
    /// The node answered an error (404: no node holds a trace of it).
    Failed(ApiError),
}

/// The message the Trace view shows.
#[derive(Debug, Clone)]
pub struct TraceState {
    /// Node index the request went to.
    pub node: usize,
    /// The message id asked for.
    pub msg_id: String,
    /// Where the request stands.
    pub status: TraceStatus,
}

pub use im_admin_api::valid_msg_id;

/// The msg_id field of a tail line, when it concerns a message.
pub fn line_msg_id(l: &LogTailLine) -> Option<&str> {
    l.fields
        .get("msg_id")
        .and_then(|v| v.as_str())
        .filter(|id| valid_msg_id(id))
}

impl TailState {
    /// Index of the selected line: the newest shown (`scroll` lines back).
    pub fn selected(&self) -> Option<usize> {
        self.lines.len().checked_sub(1 + self.scroll)
    }

    /// The msg_id of the selected line, or of the nearest older line that has one.
    pub fn selected_msg_id(&self) -> Option<&str> {
        let end = self.selected()?;
        self.lines.range(..=end).rev().find_map(line_msg_id)
    }
}

impl AppState {
    /// Opens the Trace view on `msg_id` and asks the selected node for it.
    pub(super) fn open_trace(&mut self, msg_id: String) -> Vec<Command> {
        let node = self.selected;
        let msg_id = msg_id.to_ascii_lowercase();
        self.set_view(View::Trace);
        self.trace = Some(TraceState {
            node,
            msg_id: msg_id.clone(),
            status: TraceStatus::Loading,
        });
        self.info(format!("asking for the trace of {msg_id}…"));
        vec![Command::FetchTrace { node, msg_id }]
    }

    /// `m` in the Logs view: the Trace view on the selected tail line's message.
    pub(super) fn trace_from_tail(&mut self) -> Vec<Command> {
        let id = self
            .tail
            .as_ref()
            .filter(|_| self.tail_shown())
            .and_then(|t| t.selected_msg_id().map(str::to_owned));
        match id {
            Some(id) => self.open_trace(id),
            None => {
                self.error("no msg_id on or above the selected tail line (m traces a message)");
                Vec::new()
            }
        }
    }

    /// Records the answer for `msg_id` (when it is still the one shown).
    pub(super) fn trace_answer(&mut self, msg_id: &str, result: Result<MessageTrace, ApiError>) {
        let Some(t) = self.trace.as_mut().filter(|t| t.msg_id == msg_id) else {
            return;
        };
        t.status = match result {
            Ok(m) => TraceStatus::Done(m),
            Err(e) => TraceStatus::Failed(e),
        };
    }
}
