//! The webhook outbox's rows as the store hands them out (`hooks::webhooks` is the only
//! user). Two durable queues: `webhook_outbox`, one row per committed message while an
//! endpoint wants message events (written by the message commit in its own
//! transaction, so a commit and its events are durable together), and
//! `webhook_deliveries`, one row per (endpoint, event) with its body and retry state.
//! On Postgres rows are claimed with a lease (`lease_owner`, `lease_until`) and
//! `FOR UPDATE SKIP LOCKED`, so several nodes share the queues and a dead node's rows
//! are taken over when its lease runs out; on SQLite (one node) a claim is a plain read
//! and the claims are held in memory (`store::sql::inflight`).

/// A committed message waiting to be expanded into events, with what the events say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSource {
    /// The outbox row.
    pub id: i64,
    /// Its conversation.
    pub conversation_id: String,
    /// Its seq.
    pub seq: u64,
    /// When the outbox row was written, ms.
    pub created_ms: i64,
    /// The message's sender ("" when the message is gone).
    pub sender: String,
    /// Its id.
    pub msg_id: String,
    /// `MessageType` as its wire value.
    pub msg_type: i32,
    /// RECALL and EDIT: the message they change.
    pub ref_msg_id: String,
    /// When it was committed, ms.
    pub send_time: i64,
}

/// An event to store for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The endpoint's name.
    pub endpoint: String,
    /// The event id.
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// The JSON body.
    pub body: String,
    /// When it was made, ms.
    pub created_ms: i64,
    /// Not sent before this time, ms.
    pub next_ms: i64,
    /// Stored parked (the outbox is at its bound).
    pub parked: bool,
}

/// A change to a stored event that was never tried: a merged `message.offline`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merge {
    /// The row.
    pub id: i64,
    /// Its new body.
    pub body: String,
}

/// An event claimed for sending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The row.
    pub id: i64,
    /// The event id.
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// The JSON body.
    pub body: String,
    /// When it was made, ms.
    pub created_ms: i64,
    /// Attempts made before this one.
    pub attempts: u32,
}

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 2xx: the row goes.
    Delivered(i64),
    /// Failed: try again at `next_ms`.
    Retry {
        /// The row.
        id: i64,
        /// When to try again, ms.
        next_ms: i64,
        /// The error.
        error: String,
    },
    /// Failed past the retry age: parked.
    Park {
        /// The row.
        id: i64,
        /// The error.
        error: String,
    },
}

/// A parked event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedRow {
    /// The row.
    pub id: i64,
    /// The endpoint.
    pub endpoint: String,
    /// The event id.
    pub event_id: String,
    /// Its kind.
    pub kind: String,
    /// When it was made, ms.
    pub created_ms: i64,
    /// Attempts made.
    pub attempts: u32,
    /// The last error.
    pub last_error: String,
}

/// How much the outbox holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Committed messages not yet expanded.
    pub sources: u64,
    /// Per endpoint: (name, queued, parked).
    pub endpoints: Vec<(String, u64, u64)>,
}

impl OutboxCounts {
    /// Events stored, queued and parked, over all endpoints.
    pub fn events(&self) -> u64 {
        self.endpoints.iter().map(|(_, q, p)| q + p).sum()
    }
}

/// One write of the outbox: what SQLite's commit thread runs in a message batch's
/// transaction (`store::sqlite_outbox`).
#[derive(Debug)]
pub enum OutboxWrite {
    /// [`Store::outbox_expand`](super::Store::outbox_expand).
    Expand {
        /// The expanded outbox rows.
        done: Vec<i64>,
        /// The events to store.
        events: Vec<NewEvent>,
        /// The merges into stored events never tried.
        merges: Vec<Merge>,
    },
    /// [`Store::events_settle`](super::Store::events_settle).
    Settle(Vec<Outcome>),
}
