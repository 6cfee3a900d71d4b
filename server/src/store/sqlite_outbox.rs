//! The webhook outbox's writes on the SQLite commit thread (`store::sqlite_commit`):
//! an expansion (its events stored, merges applied, the expanded outbox rows deleted)
//! and the outcomes of attempts. They ride in the transaction of the next message
//! batch, each under its own savepoint, so the outbox never takes SQLite's one write
//! lock apart from the message commits (a commit that finds the lock taken sleeps in
//! SQLite's busy handler for a millisecond or more) and adds no commit or fsync of its
//! own. The statements are `store::sql::webhooks`' own, run by rusqlite.

use rusqlite::{params, Connection};
use tokio::sync::oneshot;

use super::outbox::{Merge, NewEvent, OutboxWrite, Outcome};
use super::sql::webhooks::{
    DELETE_EVENT, DELETE_SOURCE, INSERT_EVENT, MERGE_EVENT, OUTBOX_FULL, SETTLE_FAILED,
};
use super::StoreError;

/// An outbox write waiting for a transaction to ride in, with where its answer goes:
/// the stored events' row ids (an expansion) or nothing (outcomes).
pub(crate) struct Rider {
    /// The write.
    pub write: OutboxWrite,
    /// Its answer.
    pub reply: oneshot::Sender<Result<Vec<i64>, StoreError>>,
}

/// Runs one write on `conn` (a savepoint of the batch's transaction).
pub(crate) fn apply(conn: &Connection, write: &OutboxWrite) -> Result<Vec<i64>, StoreError> {
    match write {
        OutboxWrite::Expand {
            done,
            events,
            merges,
        } => expand(conn, done, events, merges),
        OutboxWrite::Settle(outcomes) => {
            settle(conn, outcomes)?;
            Ok(Vec::new())
        }
    }
}

fn expand(
    conn: &Connection,
    done: &[i64],
    events: &[NewEvent],
    merges: &[Merge],
) -> Result<Vec<i64>, StoreError> {
    let mut ids = Vec::with_capacity(events.len());
    let mut insert = conn.prepare_cached(INSERT_EVENT)?;
    for e in events {
        let id: i64 = insert.query_row(
            params![
                e.endpoint,
                e.event_id,
                e.kind,
                e.body,
                e.created_ms,
                e.next_ms,
                i32::from(e.parked),
                if e.parked { OUTBOX_FULL } else { "" }
            ],
            |r| r.get(0),
        )?;
        ids.push(id);
    }
    let mut merge = conn.prepare_cached(MERGE_EVENT)?;
    for m in merges {
        merge.execute(params![m.body, m.id])?;
    }
    let mut delete = conn.prepare_cached(DELETE_SOURCE)?;
    for id in done {
        delete.execute(params![id])?;
    }
    Ok(ids)
}

fn settle(conn: &Connection, outcomes: &[Outcome]) -> Result<(), StoreError> {
    if outcomes.is_empty() {
        return Ok(());
    }
    let mut delete = conn.prepare_cached(DELETE_EVENT)?;
    let mut failed = conn.prepare_cached(SETTLE_FAILED)?;
    for o in outcomes {
        match o {
            Outcome::Delivered(id) => {
                delete.execute(params![id])?;
            }
            Outcome::Retry { id, next_ms, error } => {
                failed.execute(params![next_ms, 0, error, id])?;
            }
            Outcome::Park { id, error } => {
                failed.execute(params![0, 1, error, id])?;
            }
        }
    }
    Ok(())
}
