//! Persist stage: the dedicated writer that owns every store mutation. Sends, cursor
//! updates and group changes arrive on one bounded queue; sends are committed in groups
//! (a batch closes at `persist.batch_max` messages or after `persist.batch_wait_ms`;
//! delivery cursors alone wait up to `persist.cursor_wait_ms` for a write to share the
//! commit with; on Postgres they commit beside the messages instead, `cursors`), and
//! only then are SendAcks queued and the messages handed to the
//! router, in commit order.
//! Just before a batch commits, each group message's sender and recipients are checked
//! again against the membership cache, which this writer patches after every group
//! change it commits: a member removed after their Send was validated gets NOT_MEMBER,
//! and nobody removed before the commit receives the message. A group change's SYSTEM
//! event goes to the members after the change and to those it removed. MarkReads and
//! conversation flags (`WriteReq::State`) are committed together after the batch, each
//! answered `Done` then; read cursors that moved go to the receipts task.
//!
//! Log attribution: while a log filter is set (`obs::logfilter::filtered_uids`), each
//! message of a batch emits a `message committed` (or `message not committed`) event per
//! filtered sender or recipient, attributed to that uid; with no filter set this costs
//! one relaxed load per batch.

mod answer;
mod cursors;
mod guard;
mod queue;
mod refusal;
mod writer;

pub use guard::Guard;
pub use queue::{
    queue, HideReq, LastCommitted, PersistHandle, PersistReq, QueueFull, StateReq, WriteReq,
    WriterQueue,
};
pub use refusal::Refusal;
pub use writer::{Wiring, Writer};
