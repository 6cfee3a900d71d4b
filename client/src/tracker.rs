//! `SeqTracker`: per-conversation delivery cursors and the messages held above a gap.
//!
//! The invariant: conversation C's message with seq n reaches the app only once the
//! app has had seq n-1 (or n is the first after the cursor the SDK starts from).
//! Per conversation the tracker keeps `delivered` (the last seq handed to the app in
//! order, or settled as not there for this user) and the seqs that arrived above it
//! (live messages, and our own messages known from their `SendAck`, which are never
//! emitted). A seq at or below `delivered`, or already held, is a duplicate. Holes are
//! closed only by the next seq arriving or by [`SeqTracker::settle`], which the driver
//! calls with what a sync from an authoritative cursor proved. Conversations whose
//! `delivered` moved (or that saw duplicates, meaning the server's cursor lags) are
//! marked dirty, so a `DeliverAck` for `delivered` (never more) goes out for them.

use std::collections::{BTreeMap, HashMap, HashSet};

use im_proto::ChatMessage;

/// Most seqs held above a hole per conversation; past it the hole is given up (the
/// held seqs are released in order) so memory stays bounded if it is never filled.
const MAX_HELD: usize = 65_536;

/// What one arrival (a message or our own `SendAck`) did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Arrival {
    /// Messages the app may have now, in seq order (the arrival and what it unblocked).
    pub(crate) ready: Vec<ChatMessage>,
    /// The arrival is held above a hole: a sync should fill it.
    pub(crate) gap: bool,
}

#[derive(Debug, Default)]
struct Conv {
    /// Last seq the app has (or that is settled as not there for this user); 0: none yet.
    delivered: u64,
    /// Seqs above `delivered + 1`: a live message, or `None` for our own message.
    held: BTreeMap<u64, Option<ChatMessage>>,
}

impl Conv {
    /// Moves `delivered` over the held seqs that follow it, collecting their messages.
    fn release(&mut self, ready: &mut Vec<ChatMessage>) {
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() != self.delivered + 1 {
                break;
            }
            self.delivered += 1;
            if let Some(m) = entry.remove() {
                ready.push(m);
            }
        }
    }

    /// Releases everything held up to `upto` in order, declares `upto` delivered, then
    /// releases what follows it.
    fn settle(&mut self, upto: u64, ready: &mut Vec<ChatMessage>) {
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() > upto {
                break;
            }
            self.delivered = *entry.key();
            if let Some(m) = entry.remove() {
                ready.push(m);
            }
        }
        self.delivered = self.delivered.max(upto);
        self.release(ready);
    }
}

/// Delivery state for all conversations this client has seen.
#[derive(Debug, Default)]
pub(crate) struct SeqTracker {
    convs: HashMap<String, Conv>,
    dirty: HashSet<String>,
}

impl SeqTracker {
    /// A message arrived (live or in a sync page): what the app may have now.
    pub(crate) fn arrive(&mut self, m: ChatMessage) -> Arrival {
        if m.seq == 0 {
            return Arrival {
                ready: vec![m],
                gap: false,
            };
        }
        let conv = m.conversation_id.clone();
        let seq = m.seq;
        self.record(&conv, seq, Some(m))
    }

    /// Our own message `seq` in `conv` is committed (its `SendAck`): it is never
    /// emitted, but it takes its place in the order; returns what it unblocked.
    pub(crate) fn own(&mut self, conv: &str, seq: u64) -> Arrival {
        if seq == 0 {
            return Arrival::default();
        }
        self.record(conv, seq, None)
    }

    fn record(&mut self, conv: &str, seq: u64, m: Option<ChatMessage>) -> Arrival {
        let c = self.convs.entry(conv.to_owned()).or_default();
        let mut out = Arrival::default();
        if seq <= c.delivered || c.held.contains_key(&seq) {
            // The server re-sent something we have: its cursor may lag, so re-ack.
            if c.delivered > 0 {
                self.dirty.insert(conv.to_owned());
            }
            return out;
        }
        if seq == c.delivered + 1 {
            c.delivered = seq;
            out.ready.extend(m);
            c.release(&mut out.ready);
        } else {
            c.held.insert(seq, m);
            out.gap = true;
            if c.held.len() > MAX_HELD {
                if let Some(first) = c.held.keys().next().copied() {
                    c.settle(first - 1, &mut out.ready);
                }
            }
        }
        if !out.ready.is_empty() || !out.gap {
            self.dirty.insert(conv.to_owned());
        }
        out
    }

    /// Declares everything up to `upto` in `conv` settled: held seqs up to it are
    /// released in order, the seqs never seen there are taken as not there for this
    /// user (a sync from an authoritative cursor proved it). Returns what the app may
    /// have now. Never moves back.
    pub(crate) fn settle(&mut self, conv: &str, upto: u64) -> Vec<ChatMessage> {
        let mut ready = Vec::new();
        let c = self.convs.entry(conv.to_owned()).or_default();
        if upto <= c.delivered {
            return ready;
        }
        c.settle(upto, &mut ready);
        self.dirty.insert(conv.to_owned());
        ready
    }

    /// Last seq of `conv` the app has in order (0 when none: no baseline of our own).
    pub(crate) fn delivered(&self, conv: &str) -> u64 {
        self.convs.get(conv).map_or(0, |c| c.delivered)
    }

    /// Conversations with seqs held above a hole: (conversation, delivered, highest held).
    pub(crate) fn holes(&self) -> Vec<(String, u64, u64)> {
        let mut out: Vec<(String, u64, u64)> = self
            .convs
            .iter()
            .filter_map(|(k, c)| {
                let top = *c.held.keys().next_back()?;
                Some((k.clone(), c.delivered, top))
            })
            .collect();
        out.sort();
        out
    }

    /// Whether any conversation holds seqs above a hole.
    pub(crate) fn has_held(&self) -> bool {
        self.convs.values().any(|c| !c.held.is_empty())
    }

    /// Whether some conversation needs a `DeliverAck`.
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Drains the conversations needing a `DeliverAck`, with the seq to ack (`delivered`).
    pub(crate) fn take_acks(&mut self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .dirty
            .drain()
            .filter_map(|conv| {
                let seq = self.convs.get(&conv).map_or(0, |c| c.delivered);
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

    fn m(conv: &str, seq: u64) -> ChatMessage {
        ChatMessage {
            conversation_id: conv.into(),
            seq,
            ..Default::default()
        }
    }

    fn seqs(a: &Arrival) -> Vec<u64> {
        a.ready.iter().map(|m| m.seq).collect()
    }

    #[test]
    fn in_order_messages_are_ready_and_repeats_are_duplicates() {
        let mut t = SeqTracker::default();
        assert_eq!(seqs(&t.arrive(m("c", 1))), vec![1]);
        assert_eq!(seqs(&t.arrive(m("c", 2))), vec![2]);
        assert_eq!(t.arrive(m("c", 2)), Arrival::default());
        assert_eq!(t.arrive(m("c", 1)), Arrival::default());
        assert_eq!(t.delivered("c"), 2);
        assert_eq!(t.delivered("other"), 0);
    }

    #[test]
    fn a_message_above_a_hole_waits_for_it_and_follows_it() {
        let mut t = SeqTracker::default();
        assert_eq!(seqs(&t.arrive(m("c", 1))), vec![1]);
        let a = t.arrive(m("c", 3));
        assert!(a.gap && a.ready.is_empty());
        assert_eq!(t.arrive(m("c", 3)), Arrival::default(), "held: a duplicate");
        assert_eq!(t.holes(), vec![("c".to_owned(), 1, 3)]);
        // Seq 2 releases 3 with it; then 4 follows 3, never the other way round.
        assert_eq!(seqs(&t.arrive(m("c", 2))), vec![2, 3]);
        assert_eq!(seqs(&t.arrive(m("c", 4))), vec![4]);
        assert!(!t.has_held());
    }

    #[test]
    fn own_messages_take_their_place_silently() {
        let mut t = SeqTracker::default();
        assert_eq!(seqs(&t.arrive(m("c", 1))), vec![1]);
        let a = t.own("c", 3);
        assert!(a.gap && a.ready.is_empty());
        assert!(t.arrive(m("c", 4)).gap);
        // 2 arrives: 3 is ours (not emitted), 4 follows.
        assert_eq!(seqs(&t.arrive(m("c", 2))), vec![2, 4]);
        assert_eq!(t.delivered("c"), 4);
        assert_eq!(t.own("c", 5), Arrival::default());
        assert_eq!(t.delivered("c"), 5);
    }

    #[test]
    fn settle_releases_in_order_and_never_moves_back() {
        let mut t = SeqTracker::default();
        assert!(t.arrive(m("c", 57)).gap);
        assert!(t.arrive(m("c", 59)).gap);
        assert!(t.own("c", 60).gap);
        assert!(t.arrive(m("c", 62)).gap);
        let r: Vec<u64> = t.settle("c", 56).iter().map(|m| m.seq).collect();
        assert_eq!(r, vec![57], "57 follows the settled 56");
        assert_eq!(t.delivered("c"), 57);
        // Settling past 59 releases it (58 is taken as not there), 60 (ours) follows silently.
        let r: Vec<u64> = t.settle("c", 59).iter().map(|m| m.seq).collect();
        assert_eq!(r, vec![59]);
        assert_eq!(t.delivered("c"), 60);
        assert!(t.settle("c", 10).is_empty());
        assert_eq!(t.delivered("c"), 60);
        assert_eq!(seqs(&t.arrive(m("c", 61))), vec![61, 62]);
        assert_eq!(t.arrive(m("c", 58)), Arrival::default());
    }

    #[test]
    fn acks_carry_only_what_the_app_has_in_order() {
        let mut t = SeqTracker::default();
        assert!(!t.has_dirty());
        for s in 1..=5 {
            t.arrive(m("a", s));
        }
        t.arrive(m("b", 2)); // above a hole: nothing to ack
        assert!(t.has_dirty());
        assert_eq!(t.take_acks(), vec![("a".to_owned(), 5)]);
        assert!(!t.has_dirty());
        assert!(t.take_acks().is_empty());
        t.arrive(m("a", 7)); // held: the ack stays at 5
        assert!(t.take_acks().is_empty());
        t.arrive(m("b", 1));
        t.arrive(m("a", 6));
        assert_eq!(
            t.take_acks(),
            vec![("a".to_owned(), 7), ("b".to_owned(), 2)]
        );
        // A duplicate means the server's cursor lags: ack again.
        assert_eq!(t.arrive(m("a", 3)), Arrival::default());
        assert_eq!(t.take_acks(), vec![("a".to_owned(), 7)]);
    }

    #[test]
    fn a_hole_never_filled_is_given_up_in_order_past_the_cap() {
        let mut t = SeqTracker::default();
        let mut released = Vec::new();
        for s in 0..=MAX_HELD as u64 {
            released.extend(t.arrive(m("c", 10 + s)).ready.into_iter().map(|m| m.seq));
        }
        let want: Vec<u64> = (10..=10 + MAX_HELD as u64).collect();
        assert_eq!(released, want);
        assert_eq!(t.delivered("c"), 10 + MAX_HELD as u64);
        assert!(!t.has_held());
        assert_eq!(t.arrive(m("c", 5)), Arrival::default());
    }

    #[test]
    fn seq_zero_is_passed_through_untracked() {
        let mut t = SeqTracker::default();
        assert_eq!(seqs(&t.arrive(m("c", 0))), vec![0]);
        assert_eq!(seqs(&t.arrive(m("c", 0))), vec![0]);
        assert!(!t.has_dirty());
    }
}
