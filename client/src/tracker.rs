//! `SeqTracker`: per-conversation dedup and delivery cursors (exactly-once to the app).
//!
//! Per conversation it keeps the highest contiguous seq seen and the set of seqs seen
//! above it. A seq at or below the contiguous mark, or already in the set, is a
//! duplicate. Conversations whose contiguous mark moved (or that saw duplicates, meaning
//! the server's cursor lags) are marked dirty, so a `DeliverAck` goes out for them.

use std::collections::{BTreeSet, HashMap, HashSet};

/// Most seqs kept above a hole per conversation; past it the hole is given up
/// (treated as delivered) so memory stays bounded even if it is never filled.
const MAX_ABOVE: usize = 65_536;

/// What observing one message told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// First time this seq is seen; `gap` when it is ahead of the contiguous mark.
    New { gap: bool },
    /// Already seen (or known delivered): do not emit again.
    Duplicate,
}

#[derive(Debug, Default)]
struct Conv {
    contiguous: u64,
    above: BTreeSet<u64>,
}

impl Conv {
    fn absorb(&mut self) {
        while self.above.first() == Some(&(self.contiguous + 1)) {
            self.above.pop_first();
            self.contiguous += 1;
        }
    }
}

/// Dedup state for all conversations this client has seen.
#[derive(Debug, Default)]
pub(crate) struct SeqTracker {
    convs: HashMap<String, Conv>,
    dirty: HashSet<String>,
}

impl SeqTracker {
    /// Records `seq` in `conv` and says whether it is new (seq 0 is never tracked).
    pub(crate) fn observe(&mut self, conv: &str, seq: u64) -> Seen {
        if seq == 0 {
            return Seen::New { gap: false };
        }
        let c = self.convs.entry(conv.to_owned()).or_default();
        if seq <= c.contiguous || c.above.contains(&seq) {
            // The server re-sent something we have: its cursor lags, so re-ack.
            if c.contiguous > 0 {
                self.dirty.insert(conv.to_owned());
            }
            return Seen::Duplicate;
        }
        if seq == c.contiguous + 1 {
            c.contiguous = seq;
            c.absorb();
            self.dirty.insert(conv.to_owned());
            Seen::New { gap: false }
        } else {
            c.above.insert(seq);
            if c.above.len() > MAX_ABOVE {
                if let Some(&first) = c.above.first() {
                    c.contiguous = first - 1;
                    c.absorb();
                    self.dirty.insert(conv.to_owned());
                }
            }
            Seen::New { gap: true }
        }
    }

    /// Declares everything up to `upto` in `conv` delivered (the server's cursor says so).
    pub(crate) fn fast_forward(&mut self, conv: &str, upto: u64) {
        let c = self.convs.entry(conv.to_owned()).or_default();
        if upto <= c.contiguous {
            return;
        }
        c.contiguous = upto;
        c.above = c.above.split_off(&(upto + 1));
        c.absorb();
        self.dirty.insert(conv.to_owned());
    }

    /// Highest contiguous seq seen in `conv` (0 when none).
    pub(crate) fn contiguous(&self, conv: &str) -> u64 {
        self.convs.get(conv).map_or(0, |c| c.contiguous)
    }

    /// How many seqs of `conv` are held above a hole.
    pub(crate) fn above_len(&self, conv: &str) -> usize {
        self.convs.get(conv).map_or(0, |c| c.above.len())
    }

    /// Highest seq seen per conversation (contiguous or not).
    pub(crate) fn max_seen(&self) -> HashMap<String, u64> {
        self.convs
            .iter()
            .map(|(k, c)| (k.clone(), c.above.last().copied().unwrap_or(c.contiguous)))
            .collect()
    }

    /// Whether some conversation needs a `DeliverAck`.
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Drains the conversations needing a `DeliverAck`, with the seq to ack (contiguous).
    pub(crate) fn take_acks(&mut self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .dirty
            .drain()
            .filter_map(|conv| {
                let seq = self.convs.get(&conv).map_or(0, |c| c.contiguous);
                (seq > 0).then_some((conv, seq))
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_messages_are_new_and_repeats_are_duplicates() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe("c", 1), Seen::New { gap: false });
        assert_eq!(t.observe("c", 2), Seen::New { gap: false });
        assert_eq!(t.observe("c", 2), Seen::Duplicate);
        assert_eq!(t.observe("c", 1), Seen::Duplicate);
        assert_eq!(t.contiguous("c"), 2);
        assert_eq!(t.contiguous("other"), 0);
    }

    #[test]
    fn gaps_are_reported_and_filled() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe("c", 1), Seen::New { gap: false });
        assert_eq!(t.observe("c", 4), Seen::New { gap: true });
        assert_eq!(t.observe("c", 4), Seen::Duplicate);
        assert_eq!(t.contiguous("c"), 1);
        assert_eq!(t.observe("c", 3), Seen::New { gap: true });
        assert_eq!(t.observe("c", 2), Seen::New { gap: false });
        assert_eq!(t.contiguous("c"), 4);
        assert_eq!(t.max_seen()["c"], 4);
    }

    #[test]
    fn fast_forward_skips_known_delivered_and_absorbs_above() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe("c", 57), Seen::New { gap: true });
        assert_eq!(t.observe("c", 59), Seen::New { gap: true });
        t.fast_forward("c", 56);
        assert_eq!(t.contiguous("c"), 57);
        assert_eq!(t.observe("c", 30), Seen::Duplicate);
        assert_eq!(t.observe("c", 58), Seen::New { gap: false });
        assert_eq!(t.contiguous("c"), 59);
        t.fast_forward("c", 10); // never moves back
        assert_eq!(t.contiguous("c"), 59);
        t.fast_forward("c", 70);
        assert_eq!(t.contiguous("c"), 70);
        assert_eq!(t.max_seen()["c"], 70);
    }

    #[test]
    fn acks_are_coalesced_per_conversation() {
        let mut t = SeqTracker::default();
        assert!(!t.has_dirty());
        for s in 1..=5 {
            t.observe("a", s);
        }
        t.observe("b", 2); // gap: contiguous stays 0, nothing to ack
        assert!(t.has_dirty());
        assert_eq!(t.take_acks(), vec![("a".to_string(), 5)]);
        assert!(!t.has_dirty());
        assert!(t.take_acks().is_empty());
        t.observe("b", 1);
        t.observe("a", 6);
        assert_eq!(
            t.take_acks(),
            vec![("a".to_string(), 6), ("b".to_string(), 2)]
        );
        // A duplicate means the server's cursor lags: ack again.
        assert_eq!(t.observe("a", 3), Seen::Duplicate);
        assert_eq!(t.take_acks(), vec![("a".to_string(), 6)]);
    }

    #[test]
    fn a_hole_never_filled_is_given_up_past_the_cap() {
        let mut t = SeqTracker::default();
        for s in 0..=MAX_ABOVE as u64 {
            t.observe("c", 10 + s);
        }
        assert_eq!(t.contiguous("c"), 10 + MAX_ABOVE as u64);
        assert_eq!(t.above_len("c"), 0);
        assert_eq!(t.observe("c", 5), Seen::Duplicate);
    }

    #[test]
    fn seq_zero_is_passed_through_untracked() {
        let mut t = SeqTracker::default();
        assert_eq!(t.observe("c", 0), Seen::New { gap: false });
        assert_eq!(t.observe("c", 0), Seen::New { gap: false });
        assert!(!t.has_dirty());
    }
}
