//! The delivery-correctness checker: for one conversation, the seqs the sender had
//! acked and the seqs the receiver got pushed, in arrival order, are compared after the
//! run. Every acked message must be delivered exactly once, and deliveries must arrive
//! with strictly increasing seqs (docs/design.md: durability, ordering).
//!
//! Delivered-but-never-acked messages (in flight when the sender stopped or timed out)
//! and seq gaps are reported but are not failures by themselves: the server may have
//! committed a message whose ack the bench gave up on.
//!
//! Receivers that also sync (notify-and-pull groups, reconnects after a kill, a push gap
//! after a slow-consumer drop) keep a [`Stream`] per conversation: it merges pushes and
//! sync pages the way a client does (accept the next seq, skip what it already has,
//! sync on a gap) while counting anything the server got wrong: a seq pushed twice or
//! out of order, an acked seq never obtained.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::AddAssign;

use serde::Serialize;

/// The outcome of checking one or more conversations (summable with `+=`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Conversations checked.
    pub conversations: u64,
    /// Distinct acked seqs.
    pub acked: u64,
    /// Deliveries received (with repeats).
    pub delivered: u64,
    /// Acked seqs never delivered: lost messages.
    pub missing: u64,
    /// Deliveries of a seq already delivered.
    pub duplicates: u64,
    /// Deliveries whose seq was not above the previous one (includes duplicates).
    pub not_increasing: u64,
    /// Seqs acked for two different messages (the server reused a seq).
    pub seq_reused: u64,
    /// Deliveries that belong to another conversation than the receiver's.
    pub wrong_conversation: u64,
    /// Distinct delivered seqs the sender never saw acked (informational).
    pub delivered_unacked: u64,
    /// Seqs missing between the lowest and highest delivered one (informational).
    pub gaps: u64,
    /// Pushes that skipped ahead (the server dropped pushes for a slow consumer) and were
    /// recovered by a sync (informational; a gap never recovered shows as `missing`).
    pub push_gaps_synced: u64,
    /// Messages received again that the receiver already had, from a sync racing a push
    /// (informational: a client skips them by seq).
    pub overlaps: u64,
}

impl Verdict {
    /// Whether nothing was lost, duplicated, reordered or misrouted.
    pub fn passed(&self) -> bool {
        self.missing == 0
            && self.duplicates == 0
            && self.not_increasing == 0
            && self.seq_reused == 0
            && self.wrong_conversation == 0
    }
}

impl AddAssign for Verdict {
    fn add_assign(&mut self, o: Verdict) {
        self.conversations += o.conversations;
        self.acked += o.acked;
        self.delivered += o.delivered;
        self.missing += o.missing;
        self.duplicates += o.duplicates;
        self.not_increasing += o.not_increasing;
        self.seq_reused += o.seq_reused;
        self.wrong_conversation += o.wrong_conversation;
        self.delivered_unacked += o.delivered_unacked;
        self.gaps += o.gaps;
        self.push_gaps_synced += o.push_gaps_synced;
        self.overlaps += o.overlaps;
    }
}

/// Checks one conversation: `acked` holds the seq of every acked message (any order;
/// sorted in place), `delivered` the seqs as they arrived (sorted in place after the
/// order check), `wrong_conversation` the receiver's count of misrouted deliveries.
pub fn check(acked: &mut [u64], delivered: &mut [u64], wrong_conversation: u64) -> Verdict {
    let not_increasing = delivered.windows(2).filter(|w| w[1] <= w[0]).count() as u64;
    acked.sort_unstable();
    delivered.sort_unstable();
    let seq_reused = acked.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    let duplicates = delivered.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    let gaps = delivered
        .windows(2)
        .map(|w| (w[1] - w[0]).saturating_sub(1))
        .sum();

    // Merge walk over the two sorted lists, each seq taken once.
    let (mut a, mut d) = (0, 0);
    let (mut missing, mut delivered_unacked, mut acked_distinct) = (0u64, 0u64, 0u64);
    while a < acked.len() || d < delivered.len() {
        let next_a = acked.get(a).copied();
        let next_d = delivered.get(d).copied();
        let seq = match (next_a, next_d) {
            (Some(x), Some(y)) => x.min(y),
            (Some(x), None) => x,
            (None, Some(y)) => y,
            (None, None) => break,
        };
        let in_acked = next_a == Some(seq);
        let in_delivered = next_d == Some(seq);
        acked_distinct += in_acked as u64;
        match (in_acked, in_delivered) {
            (true, false) => missing += 1,
            (false, true) => delivered_unacked += 1,
            _ => {}
        }
        while acked.get(a) == Some(&seq) {
            a += 1;
        }
        while delivered.get(d) == Some(&seq) {
            d += 1;
        }
    }

    Verdict {
        conversations: 1,
        acked: acked_distinct,
        delivered: delivered.len() as u64,
        missing,
        duplicates,
        not_increasing,
        seq_reused,
        wrong_conversation,
        delivered_unacked,
        gaps,
        push_gaps_synced: 0,
        overlaps: 0,
    }
}

/// Checks many conversations at once: `acked` and `delivered` are keyed the same way
/// (e.g. by recipient and conversation); a key on only one side is checked against an
/// empty list.
pub fn check_all<K: Hash + Eq>(
    mut acked: HashMap<K, Vec<u64>>,
    delivered: HashMap<K, Vec<u64>>,
) -> Verdict {
    let mut total = Verdict::default();
    for (key, mut seqs) in delivered {
        let mut a = acked.remove(&key).unwrap_or_default();
        total += check(&mut a, &mut seqs, 0);
    }
    for (_, mut a) in acked {
        total += check(&mut a, &mut [], 0);
    }
    total
}

/// What a receiver does with a pushed message (see [`Stream::push`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The next seq: delivered to the application.
    Accepted,
    /// Already had it (or a repeat): skipped.
    Skipped,
    /// Seqs are missing before it: skipped, and the receiver must sync.
    Gap,
}

/// A receiver's view of one conversation fed by pushes and sync pages.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    /// Highest seq accepted.
    last: u64,
    /// Accepted seqs as inclusive ranges, increasing.
    ranges: Vec<(u64, u64)>,
    /// Highest seq pushed.
    last_push: u64,
    pushed: u64,
    synced: u64,
    push_duplicates: u64,
    push_reordered: u64,
    push_gaps: u64,
    overlaps: u64,
    sync_holes: u64,
    sync_unordered: u64,
    /// Last seq of the sync page being read (order check within a page).
    page_last: u64,
}

impl Stream {
    /// A stream that starts after seq `after` (0 for a new conversation).
    pub fn new(after: u64) -> Self {
        Stream {
            last: after,
            last_push: after,
            ..Stream::default()
        }
    }

    /// The highest seq accepted: the cursor to sync after.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Distinct seqs accepted.
    pub fn accepted(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a + 1).sum()
    }

    fn contains(&self, seq: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, hi)| hi < seq);
        self.ranges.get(i).is_some_and(|&(lo, _)| lo <= seq)
    }

    fn accept(&mut self, seq: u64) {
        match self.ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == seq => *hi = seq,
            _ => self.ranges.push((seq, seq)),
        }
        self.last = seq;
    }

    /// A pushed message. Pushes must arrive with strictly increasing seqs (counted as a
    /// duplicate or a reorder otherwise); one past a missing seq is a gap.
    pub fn push(&mut self, seq: u64) -> Take {
        self.pushed += 1;
        if seq <= self.last_push {
            if self.contains(seq) {
                self.push_duplicates += 1;
            } else {
                self.push_reordered += 1;
            }
            return Take::Skipped;
        }
        self.last_push = seq;
        if seq <= self.last {
            self.overlaps += 1;
            Take::Skipped
        } else if seq == self.last + 1 {
            self.accept(seq);
            Take::Accepted
        } else {
            self.push_gaps += 1;
            Take::Gap
        }
    }

    /// Starts reading a sync page.
    pub fn page_start(&mut self) {
        self.page_last = 0;
    }

    /// A message of a sync page. Pages are ordered by seq; what the receiver already has
    /// is skipped; a seq past a missing one is accepted (the store is gapless, so the
    /// hole is counted; an acked seq in it shows as missing).
    pub fn synced(&mut self, seq: u64) -> Take {
        self.synced += 1;
        if seq <= self.page_last {
            self.sync_unordered += 1;
        }
        self.page_last = seq;
        if seq <= self.last {
            self.overlaps += 1;
            return Take::Skipped;
        }
        self.sync_holes += seq - self.last - 1;
        self.accept(seq);
        Take::Accepted
    }

    /// Checks the stream against the seqs acked to the sender(s), sorted ascending
    /// (repeats allowed: a repeat is a reused seq). `wrong_conversation` is the
    /// receiver's count of misrouted messages.
    pub fn verdict(&self, acked: &[u64], wrong_conversation: u64) -> Verdict {
        debug_assert!(
            acked.windows(2).all(|w| w[0] <= w[1]),
            "acked must be sorted"
        );
        let seq_reused = acked.windows(2).filter(|w| w[0] == w[1]).count() as u64;
        let mut distinct = 0u64;
        let mut missing = 0u64;
        let mut acked_accepted = 0u64;
        let mut prev = None;
        for &seq in acked.iter() {
            if prev == Some(seq) {
                continue;
            }
            prev = Some(seq);
            distinct += 1;
            if self.contains(seq) {
                acked_accepted += 1;
            } else {
                missing += 1;
            }
        }
        let between: u64 = self.ranges.windows(2).map(|w| w[1].0 - w[0].1 - 1).sum();
        Verdict {
            conversations: 1,
            acked: distinct,
            delivered: self.pushed + self.synced,
            missing,
            duplicates: self.push_duplicates,
            not_increasing: self.push_duplicates + self.push_reordered + self.sync_unordered,
            seq_reused,
            wrong_conversation,
            delivered_unacked: self.accepted() - acked_accepted,
            gaps: between.max(self.sync_holes),
            push_gaps_synced: self.push_gaps,
            overlaps: self.overlaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(acked: &[u64], delivered: &[u64]) -> Verdict {
        check(&mut acked.to_vec(), &mut delivered.to_vec(), 0)
    }

    #[test]
    fn exact_delivery_passes() {
        let v = run(&[3, 1, 2, 4], &[1, 2, 3, 4]);
        assert!(v.passed(), "{v:?}");
        assert_eq!((v.acked, v.delivered, v.gaps), (4, 4, 0));
        assert!(run(&[], &[]).passed());
    }

    #[test]
    fn unacked_deliveries_and_gaps_are_informational() {
        // 5 was committed and delivered but its ack never came; 3 was never seen.
        let v = run(&[1, 2, 4], &[1, 2, 4, 5]);
        assert!(v.passed(), "{v:?}");
        assert_eq!((v.delivered_unacked, v.gaps), (1, 1));
    }

    #[test]
    fn loss_duplicates_and_reordering_fail() {
        let lost = run(&[1, 2, 3], &[1, 3]);
        assert_eq!(lost.missing, 1);
        assert!(!lost.passed());

        let dup = run(&[1, 2], &[1, 2, 2]);
        assert_eq!((dup.duplicates, dup.not_increasing, dup.missing), (1, 1, 0));
        assert!(!dup.passed());

        let reordered = run(&[1, 2, 3], &[1, 3, 2]);
        assert_eq!((reordered.not_increasing, reordered.duplicates), (1, 0));
        assert!(!reordered.passed());

        let reused = run(&[1, 1, 2], &[1, 2]);
        assert_eq!((reused.seq_reused, reused.acked), (1, 2));
        assert!(!reused.passed());

        let misrouted = check(&mut [1], &mut [1], 1);
        assert!(!misrouted.passed());
    }

    #[test]
    fn streams_merge_pushes_and_syncs() {
        let mut s = Stream::new(0);
        assert_eq!(s.push(1), Take::Accepted);
        assert_eq!(s.push(2), Take::Accepted);
        // 3 and 4 dropped for a slow consumer: 5 is a gap, a sync fetches 3..=6.
        assert_eq!(s.push(5), Take::Gap);
        s.page_start();
        for seq in 3..=6 {
            assert_eq!(s.synced(seq), Take::Accepted);
        }
        // 6 was pushed while the sync ran: skipped, not a duplicate.
        assert_eq!(s.push(6), Take::Skipped);
        assert_eq!(s.push(7), Take::Accepted);
        assert_eq!(s.last(), 7);
        let v = s.verdict(&(1..=7).collect::<Vec<_>>(), 0);
        assert!(v.passed(), "{v:?}");
        assert_eq!(
            (v.push_gaps_synced, v.overlaps, v.acked, v.missing),
            (1, 1, 7, 0)
        );
        assert_eq!(v.delivered_unacked, 0);
    }

    #[test]
    fn streams_catch_server_mistakes() {
        let mut s = Stream::new(0);
        s.push(1);
        s.push(2);
        assert_eq!(s.push(2), Take::Skipped);
        let v = s.verdict(&[1, 2], 0);
        assert_eq!((v.duplicates, v.not_increasing), (1, 1));
        assert!(!v.passed());

        // Acked 3 never arrives (not pushed, not in the sync).
        let mut s = Stream::new(0);
        s.push(1);
        s.page_start();
        s.synced(2);
        s.synced(4);
        let v = s.verdict(&[1, 2, 3, 4], 0);
        assert_eq!((v.missing, v.gaps), (1, 1));
        assert!(!v.passed());

        // Sync pages out of order, a reused seq in the acks.
        let mut s = Stream::new(0);
        s.page_start();
        s.synced(2);
        s.synced(1);
        let v = s.verdict(&[1, 1, 2], 0);
        assert_eq!((v.not_increasing, v.seq_reused), (1, 1));
        assert!(!v.passed());
        assert!(Stream::new(5).verdict(&[], 0).passed());
    }

    #[test]
    fn keyed_checks_cover_both_sides() {
        let acked = HashMap::from([("a", vec![1, 2]), ("b", vec![1])]);
        let delivered = HashMap::from([("a", vec![1, 2]), ("c", vec![1])]);
        let v = check_all(acked, delivered);
        assert_eq!((v.conversations, v.missing, v.delivered_unacked), (3, 1, 1));
        assert!(!v.passed());
    }

    #[test]
    fn verdicts_sum() {
        let mut total = Verdict::default();
        total += run(&[1, 2], &[1, 2]);
        total += run(&[1], &[]);
        assert_eq!(
            (
                total.conversations,
                total.acked,
                total.delivered,
                total.missing
            ),
            (2, 3, 2, 1)
        );
        assert!(!total.passed());
    }
}
