//! In-memory claims of the webhook outbox on a single-node store (SQLite): which rows
//! a sender or the expander has taken, so a claim is a plain read (no write
//! transaction competing with message commits for the one SQLite write lock). Rows a
//! write is about to change, or changed moments ago, stay marked for [`GRACE_MS`], so a
//! claim whose read began before that write committed cannot take a stale copy. A
//! SIGKILL loses the marks and every unsettled row is due again (at-least-once).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a row stays marked after a write settled it, ms; a claim whose read takes
/// longer than this takes nothing.
pub(crate) const GRACE_MS: i64 = 1000;

/// Most rows marked at once; a claim past it takes nothing (the senders back off).
const MAX_MARKED: usize = 20_000;

/// Marked rows of one table: id -> until (ms since the epoch; `i64::MAX`: a write on it
/// is under way).
#[derive(Debug, Default)]
pub(crate) struct Marks {
    rows: Mutex<HashMap<i64, i64>>,
}

impl Marks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, i64>> {
        // A panic while holding it leaves a valid map: keep going.
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The marked ids a claim's read excludes (expired marks dropped), or `None` when
    /// too many are marked to claim now.
    pub(crate) fn excluded(&self) -> Option<Vec<i64>> {
        let now = im_proto::now_ms();
        let mut rows = self.lock();
        rows.retain(|_, until| *until > now);
        (rows.len() < MAX_MARKED).then(|| rows.keys().copied().collect())
    }

    /// Of the ids a read begun at `started` returned, those now claimed until `until`
    /// (the ones marked meanwhile are left out; all of them if the read was too slow).
    pub(crate) fn claim(&self, ids: &[i64], until: i64, started: Instant) -> Vec<bool> {
        if started.elapsed() >= Duration::from_millis(GRACE_MS as u64) {
            return vec![false; ids.len()];
        }
        let now = im_proto::now_ms();
        let mut rows = self.lock();
        ids.iter()
            .map(|id| match rows.get(id) {
                Some(u) if *u > now => false,
                _ => {
                    rows.insert(*id, until);
                    true
                }
            })
            .collect()
    }

    /// Marks the unclaimed ids of `ids` as being written (returned true); a claimed one
    /// is left alone (false).
    pub(crate) fn reserve(&self, ids: &[i64]) -> Vec<bool> {
        let now = im_proto::now_ms();
        let mut rows = self.lock();
        ids.iter()
            .map(|id| match rows.get(id) {
                Some(u) if *u > now => false,
                _ => {
                    rows.insert(*id, i64::MAX);
                    true
                }
            })
            .collect()
    }

    /// Marks `ids` as written just now: claimable again after [`GRACE_MS`].
    pub(crate) fn settled(&self, ids: impl IntoIterator<Item = i64>) {
        let until = im_proto::now_ms() + GRACE_MS;
        let mut rows = self.lock();
        for id in ids {
            rows.insert(id, until);
        }
    }
}

/// The marks of both outbox tables.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// `webhook_outbox` rows (committed messages being expanded).
    pub(crate) sources: Marks,
    /// `webhook_deliveries` rows (events being sent).
    pub(crate) events: Marks,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_row_is_not_claimed_twice_nor_merged_into() {
        let m = Marks::default();
        let until = im_proto::now_ms() + 60_000;
        assert_eq!(m.claim(&[1, 2], until, Instant::now()), vec![true, true]);
        assert_eq!(m.claim(&[2, 3], until, Instant::now()), vec![false, true]);
        assert_eq!(m.reserve(&[1, 4]), vec![false, true]);
        assert_eq!(m.claim(&[4], until, Instant::now()), vec![false]);
        m.settled([1, 4]);
        // Settled moments ago: still left out, then claimable.
        assert_eq!(m.claim(&[1], until, Instant::now()), vec![false]);
        let mut excluded = m.excluded().unwrap();
        excluded.sort_unstable();
        assert_eq!(excluded, vec![1, 2, 3, 4]);
        // An expired claim (a sender that died) is claimable again.
        assert_eq!(
            m.claim(&[9], im_proto::now_ms() - 1, Instant::now()),
            vec![true]
        );
        assert_eq!(m.claim(&[9], until, Instant::now()), vec![true]);
    }

    #[test]
    fn a_slow_read_claims_nothing() {
        let m = Marks::default();
        let started = Instant::now() - Duration::from_millis(GRACE_MS as u64 + 1);
        assert_eq!(m.claim(&[1], i64::MAX, started), vec![false]);
    }
}
