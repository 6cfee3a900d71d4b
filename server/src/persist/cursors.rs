//! The delivery cursors waiting for their commit ([`Cursors`]): the furthest seq per
//! (user, device, conversation) the DeliverAcks reported, committed a share at a time.
//!
//! Where the store has one writer (SQLite) a share rides with the Sends' commit. Where
//! its transactions run side by side (Postgres, [`Store::commits_side_by_side`]) a
//! share commits in a transaction of its own, beside the writer's message commits, one
//! share at a time ([`Cursors::start`]): a Send's commit then neither carries nor waits
//! for a large group's thousands of DeliverAcks. The writer owns the cursors and records
//! each commit's outcome in the store's health.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;

use super::Guard;
use crate::store::{CursorUpdate, Store, StoreError};

/// Most delivery cursors one commit carries; the rest go with the next (so no commit
/// writes thousands of a large group's DeliverAcks at once).
pub(super) const CURSORS_PER_COMMIT: usize = 1024;

/// A delivery cursor's key: (user, device, conversation).
type CursorKey = (String, String, String);

/// A share's commit running beside the message commits, with the share (given back
/// when it fails).
type Job = JoinHandle<(Vec<CursorUpdate>, Result<(), StoreError>)>;

/// The delivery cursors not yet committed, and the share being committed beside the
/// messages, if any.
#[derive(Default)]
pub(super) struct Cursors {
    pending: HashMap<CursorKey, u64>,
    /// Shares commit in their own transaction, beside the message commits.
    beside: bool,
    job: Option<Job>,
}

impl Cursors {
    /// Cursors that commit beside the message commits (`beside`) or with them.
    pub(super) fn new(beside: bool) -> Self {
        Cursors {
            beside,
            ..Cursors::default()
        }
    }

    /// Moves a delivery cursor forward (never back).
    pub(super) fn add(&mut self, c: CursorUpdate) {
        let seq = self
            .pending
            .entry((c.user_id, c.device_id, c.conversation_id))
            .or_insert(0);
        *seq = (*seq).max(c.seq);
    }

    /// Gives back cursors whose commit failed: they go with a later one.
    pub(super) fn restore(&mut self, cursors: Vec<CursorUpdate>) {
        for c in cursors {
            self.add(c);
        }
    }

    /// No cursor waits for a commit (one may be committing beside).
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// A share of the cursors (at most `max`), taken out.
    pub(super) fn take(&mut self, max: usize) -> Vec<CursorUpdate> {
        if self.pending.len() <= max {
            return self.pending.drain().map(cursor_update).collect();
        }
        let keys: Vec<_> = self.pending.keys().take(max).cloned().collect();
        keys.iter()
            .filter_map(|k| self.pending.remove_entry(k))
            .map(cursor_update)
            .collect()
    }

    /// The share a message commit carries: none when the cursors commit beside.
    pub(super) fn for_messages(&mut self) -> Vec<CursorUpdate> {
        if self.beside {
            return Vec::new();
        }
        self.take(CURSORS_PER_COMMIT)
    }

    /// Whether shares commit beside the message commits.
    pub(super) fn beside(&self) -> bool {
        self.beside
    }

    /// A share's commit is running beside, or has ended and waits to be reaped.
    pub(super) fn running(&self) -> bool {
        self.job.is_some()
    }

    /// A share's commit beside has ended and waits to be reaped ([`Cursors::finished`]).
    pub(super) fn ended(&self) -> bool {
        self.job.as_ref().is_some_and(|j| j.is_finished())
    }

    /// Starts a share's commit beside the messages: only when cursors commit beside,
    /// none is running and some wait. Bounded in time by the guard, timed in
    /// `im_persist_cursor_commit_seconds` (the `persist_commit` stage stays the
    /// messages').
    pub(super) fn start(&mut self, store: Arc<dyn Store>, guard: &Guard) {
        if !self.beside || self.job.is_some() || self.pending.is_empty() {
            return;
        }
        let share = self.take(CURSORS_PER_COMMIT);
        let guard = guard.clone();
        self.job = Some(tokio::spawn(async move {
            let start = Instant::now();
            let result = guard.bounded(store.commit_batch(&[], &share)).await;
            metrics::histogram!("im_persist_cursor_commit_seconds")
                .record(start.elapsed().as_secs_f64());
            (share, result.map(|_| ()))
        }));
    }

    /// Waits for the share committing beside to end (forever when none is running) and
    /// gives its outcome: a failed share is given back. `None`: the task was lost (a
    /// panic), and its share with it.
    pub(super) async fn finished(&mut self) -> Option<Result<(), StoreError>> {
        let Some(job) = self.job.as_mut() else {
            return std::future::pending().await;
        };
        let out = job.await;
        self.job = None;
        match out {
            Ok((_, Ok(()))) => Some(Ok(())),
            Ok((share, Err(e))) => {
                self.restore(share);
                Some(Err(e))
            }
            Err(e) => {
                tracing::error!(error = %e, "delivery cursor commit lost");
                None
            }
        }
    }
}

/// A cursor entry as the store takes it.
fn cursor_update(((user_id, device_id, conversation_id), seq): (CursorKey, u64)) -> CursorUpdate {
    CursorUpdate {
        user_id,
        device_id,
        conversation_id,
        seq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(user: &str, seq: u64) -> CursorUpdate {
        CursorUpdate {
            user_id: user.into(),
            device_id: "d".into(),
            conversation_id: "g:big".into(),
            seq,
        }
    }

    #[test]
    fn a_commit_takes_at_most_its_share_of_cursors_and_leaves_the_rest() {
        let mut c = Cursors::new(false);
        for u in 0..10 {
            c.add(cursor(&format!("u{u}"), 5));
        }
        c.add(cursor("u0", 3));
        c.add(cursor("u0", 7));
        let first = c.take(4);
        assert_eq!((first.len(), c.pending.len()), (4, 6));
        let rest = c.take(100);
        assert_eq!((rest.len(), c.pending.len()), (6, 0));
        let all: Vec<_> = first.into_iter().chain(rest).collect();
        let users: std::collections::HashSet<_> = all.iter().map(|c| c.user_id.clone()).collect();
        assert_eq!(users.len(), 10, "each cursor once");
        let u0 = all.iter().find(|c| c.user_id == "u0").map(|c| c.seq);
        assert_eq!(u0, Some(7), "the furthest seq, never back");
    }

    #[test]
    fn cursors_that_commit_beside_ride_with_no_message_commit() {
        let mut beside = Cursors::new(true);
        let mut with = Cursors::new(false);
        for c in [&mut beside, &mut with] {
            c.add(cursor("u1", 4));
        }
        assert!(beside.for_messages().is_empty());
        assert!(!beside.is_empty(), "still waiting for its own commit");
        assert_eq!(with.for_messages().len(), 1);
        assert!(with.is_empty());
    }

    #[test]
    fn a_failed_share_given_back_never_moves_a_cursor_back() {
        let mut c = Cursors::new(true);
        c.add(cursor("u1", 4));
        let share = c.take(10);
        c.add(cursor("u1", 9));
        c.restore(share);
        assert_eq!(c.take(10)[0].seq, 9);
    }
}
