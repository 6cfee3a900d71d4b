//! In-memory claims of the webhook outbox on a single-node store (SQLite): which rows
//! a sender or the expander has taken, so a claim is a plain read (no write
//! transaction competing with message commits for the one SQLite write lock). Rows a
//! write is changing are not claimed, nor rows a write settled after a claim's read
//! began (the read may hold their old state): writes are numbered as they settle. A
//! SIGKILL loses the marks and every unsettled row is due again (at-least-once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a settled row's mark is kept, ms; a claim whose read takes longer than
/// this takes nothing.
const KEEP_MS: u64 = 10_000;

/// Most rows marked at once; a claim past it takes nothing (the senders back off).
const MAX_MARKED: usize = 50_000;

/// What is known of one row.
#[derive(Debug, Clone, Copy)]
enum Mark {
    /// Claimed until this time, ms since the epoch.
    Claimed(i64),
    /// A write on it is under way.
    Busy,
    /// A write on it committed as write number `gen`, at `at` ms.
    Settled { gen: u64, at: i64 },
}

/// Where a claim's read began: the writes settled by then, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadStart {
    gen: u64,
    at: Instant,
}

/// Marked rows of one table.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    rows: Mutex<HashMap<i64, Mark>>,
    /// Writes settled so far.
    gen: AtomicU64,
}

impl Marks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Mark>> {
        // A panic while holding it leaves a valid map: keep going.
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Before a claim's read: the ids it excludes (claimed or being written; old marks
    /// dropped) and where it began, or `None` when too many are marked to claim now.
    pub(crate) fn begin(&self) -> Option<(Vec<i64>, ReadStart)> {
        let now = im_proto::now_ms();
        let keep = now - KEEP_MS as i64;
        let mut rows = self.lock();
        rows.retain(|_, m| match m {
            Mark::Claimed(until) => *until > now,
            Mark::Busy => true,
            Mark::Settled { at, .. } => *at > keep,
        });
        if rows.len() >= MAX_MARKED {
            return None;
        }
        let excluded = rows
            .iter()
            .filter(|(_, m)| !matches!(m, Mark::Settled { .. }))
            .map(|(id, _)| *id)
            .collect();
        let start = ReadStart {
            gen: self.gen.load(Ordering::SeqCst),
            at: Instant::now(),
        };
        Some((excluded, start))
    }

    /// Of the ids a read begun at `start` returned, those now claimed until `until`:
    /// not those claimed or being written, nor those a write settled after the read
    /// began (the read may hold their old state); none if the read was too slow.
    pub(crate) fn claim(&self, ids: &[i64], until: i64, start: ReadStart) -> Vec<bool> {
        if start.at.elapsed() >= Duration::from_millis(KEEP_MS) {
            return vec![false; ids.len()];
        }
        let now = im_proto::now_ms();
        let mut rows = self.lock();
        ids.iter()
            .map(|id| {
                let free = match rows.get(id) {
                    Some(Mark::Claimed(u)) => *u <= now,
                    Some(Mark::Busy) => false,
                    Some(Mark::Settled { gen, .. }) => *gen <= start.gen,
                    None => true,
                };
                if free {
                    rows.insert(*id, Mark::Claimed(until));
                }
                free
            })
            .collect()
    }

    /// Marks the unclaimed ids of `ids` as being written (returned true); a claimed one
    /// is left alone (false).
    pub(crate) fn reserve(&self, ids: &[i64]) -> Vec<bool> {
        let now = im_proto::now_ms();
        let mut rows = self.lock();
        ids.iter()
            .map(|id| {
                let free = match rows.get(id) {
                    Some(Mark::Claimed(u)) => *u <= now,
                    Some(Mark::Busy) => false,
                    Some(Mark::Settled { .. }) | None => true,
                };
                if free {
                    rows.insert(*id, Mark::Busy);
                }
                free
            })
            .collect()
    }

    /// Marks `ids` as written by a write that has committed (or failed) just now.
    pub(crate) fn settled(&self, ids: impl IntoIterator<Item = i64>) {
        let at = im_proto::now_ms();
        let mut rows = self.lock();
        let gen = self.gen.fetch_add(1, Ordering::SeqCst) + 1;
        for id in ids {
            rows.insert(id, Mark::Settled { gen, at });
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

    fn claim(m: &Marks, ids: &[i64], until: i64) -> Vec<bool> {
        let (_, start) = m.begin().expect("not too many");
        m.claim(ids, until, start)
    }

    #[test]
    fn a_claimed_row_is_not_claimed_twice_nor_merged_into() {
        let m = Marks::default();
        let until = im_proto::now_ms() + 60_000;
        assert_eq!(claim(&m, &[1, 2], until), vec![true, true]);
        assert_eq!(claim(&m, &[2, 3], until), vec![false, true]);
        assert_eq!(m.reserve(&[1, 4]), vec![false, true]);
        assert_eq!(claim(&m, &[4], until), vec![false]);
        let (mut excluded, _) = m.begin().unwrap();
        excluded.sort_unstable();
        assert_eq!(excluded, vec![1, 2, 3, 4]);
        // An expired claim (a sender that died) is claimable again.
        assert_eq!(claim(&m, &[9], im_proto::now_ms() - 1), vec![true]);
        assert_eq!(claim(&m, &[9], until), vec![true]);
    }

    #[test]
    fn a_read_begun_before_a_write_settled_does_not_take_its_rows() {
        let m = Marks::default();
        let until = im_proto::now_ms() + 60_000;
        assert_eq!(claim(&m, &[1, 2], until), vec![true, true]);
        let (_, before) = m.begin().unwrap();
        m.settled([1, 2]);
        // The read began before the write committed: it may hold the old rows.
        assert_eq!(m.claim(&[1, 2], until, before), vec![false, false]);
        // One begun after takes them at once.
        assert_eq!(claim(&m, &[1, 2], until), vec![true, true]);
    }

    #[test]
    fn a_slow_read_claims_nothing() {
        let m = Marks::default();
        let (_, mut start) = m.begin().unwrap();
        start.at -= Duration::from_millis(KEEP_MS + 1);
        assert_eq!(m.claim(&[1], i64::MAX, start), vec![false]);
    }
}
