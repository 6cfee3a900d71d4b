//! The delivery-correctness checker: for one conversation, the seqs the sender had
//! acked and the seqs the receiver got pushed, in arrival order, are compared after the
//! run. Every acked message must be delivered exactly once, and deliveries must arrive
//! with strictly increasing seqs (DESIGN.md section 4: durability, ordering).
//!
//! Delivered-but-never-acked messages (in flight when the sender stopped or timed out)
//! and seq gaps are reported but are not failures by themselves: the server may have
//! committed a message whose ack the bench gave up on.

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
