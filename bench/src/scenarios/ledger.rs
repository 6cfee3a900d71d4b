//! The delivery ledger of the scenarios in which every connection both sends messages to
//! others (one-to-one, and in `mix` to groups) and receives theirs (`idle`, `mix`): each
//! connection keeps a [`Ledger`] (what it was acked, per recipient and conversation, a
//! group message once per other member; what it was delivered, per conversation), and the run's [`Expect`] tells a receiver, once every sender has
//! drained, which seq it must reach in each conversation before it may stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use im_proto::ChatMessage;
use tokio::time::Instant;

use crate::check::{check_all, Verdict};
use crate::stats::Counter;

/// One connection's record of its one-to-one traffic.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Seqs acked to this connection, by (recipient index, conversation).
    acked: HashMap<(u32, String), Vec<u64>>,
    /// Seqs delivered to this connection, by conversation, in arrival order.
    delivered: HashMap<String, Vec<u64>>,
    /// The highest seq delivered, by conversation.
    last: HashMap<String, u64>,
    /// Deliveries of a conversation this user is not part of.
    wrong: u64,
}

impl Ledger {
    /// Records a SendAck of a message to recipient `to` in `conversation`.
    pub fn acked(&mut self, to: u32, conversation: &str, seq: u64) {
        match self.acked.get_mut(&(to, conversation.to_owned())) {
            Some(v) => v.push(seq),
            None => {
                self.acked.insert((to, conversation.to_owned()), vec![seq]);
            }
        }
    }

    /// Records a delivered message; `me` is this connection's user id. Returns whether
    /// it belongs to a conversation of `me` (else it is counted as misrouted).
    pub fn delivered(&mut self, me: &str, m: &ChatMessage) -> bool {
        let mine =
            im_proto::parse_conversation(&m.conversation_id).is_some_and(|c| c.is_direct_party(me));
        self.delivered_if(m, mine)
    }

    /// Records a delivered message whose conversation the caller has checked (`mine`:
    /// the receiver is a party to it, e.g. a member of its group). Returns `mine` (a
    /// message that is not counted as misrouted).
    pub fn delivered_if(&mut self, m: &ChatMessage, mine: bool) -> bool {
        if !mine {
            self.wrong += 1;
            return false;
        }
        match self.delivered.get_mut(m.conversation_id.as_str()) {
            Some(v) => v.push(m.seq),
            None => {
                self.delivered
                    .insert(m.conversation_id.clone(), vec![m.seq]);
            }
        }
        match self.last.get_mut(m.conversation_id.as_str()) {
            Some(l) => *l = (*l).max(m.seq),
            None => {
                self.last.insert(m.conversation_id.clone(), m.seq);
            }
        }
        true
    }

    /// Puts the deliveries of the conversations `which` picks in seq order, as a client
    /// SDK hands them to the app (on a cluster, pushes of one group from senders on
    /// different nodes may arrive out of order: docs/cluster.md); returns how many
    /// arrivals were below the one before. Duplicates stay and still fail the check.
    pub fn sort_deliveries(&mut self, which: impl Fn(&str) -> bool) -> u64 {
        let mut reordered = 0;
        for (conv, seqs) in &mut self.delivered {
            if which(conv) {
                reordered += seqs.windows(2).filter(|w| w[1] < w[0]).count() as u64;
                seqs.sort_unstable();
            }
        }
        reordered
    }

    /// The highest seq delivered in `conversation` (0 if none).
    pub fn last(&self, conversation: &str) -> u64 {
        self.last.get(conversation).copied().unwrap_or(0)
    }

    /// Hands this connection's acked maxima to `expect` (call once, after draining).
    pub fn publish(&self, expect: &Expect) {
        for ((to, conv), seqs) in &self.acked {
            let Some(max) = seqs.iter().copied().max() else {
                continue;
            };
            if let Some(slot) = expect.per_user.get(*to as usize) {
                if let Ok(mut m) = slot.lock() {
                    let e = m.entry(conv.clone()).or_default();
                    *e = (*e).max(max);
                }
            }
        }
        if expect.senders_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            expect.done.store(true, Ordering::Release);
        }
    }
}

/// What receivers wait for at the end of the run.
#[derive(Debug)]
pub struct Expect {
    per_user: Vec<Mutex<HashMap<String, u64>>>,
    senders_left: AtomicUsize,
    done: AtomicBool,
}

impl Expect {
    /// For `users` connections, each of which will [`Ledger::publish`] once.
    pub fn new(users: usize) -> Self {
        Expect {
            per_user: (0..users).map(|_| Mutex::new(HashMap::new())).collect(),
            senders_left: AtomicUsize::new(users),
            done: AtomicBool::new(users == 0),
        }
    }

    /// A sender that will never publish (it failed to connect) is written off.
    pub fn absent(&self) {
        if self.senders_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.store(true, Ordering::Release);
        }
    }

    /// Whether every sender has published.
    pub fn all_published(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Whether receiver `me` has every acked message it is owed.
    pub fn caught_up(&self, me: usize, ledger: &Ledger) -> bool {
        if !self.all_published() {
            return false;
        }
        let Some(Ok(m)) = self.per_user.get(me).map(|s| s.lock()) else {
            return true;
        };
        m.iter().all(|(conv, &max)| ledger.last(conv) >= max)
    }
}

/// Checks all ledgers: ledger `i` belongs to recipient index `i`.
pub fn verdict(ledgers: Vec<Ledger>) -> Verdict {
    let mut acked: HashMap<(u32, String), Vec<u64>> = HashMap::new();
    let mut delivered: HashMap<(u32, String), Vec<u64>> = HashMap::new();
    let mut wrong = 0;
    for (me, l) in ledgers.into_iter().enumerate() {
        wrong += l.wrong;
        for (key, seqs) in l.acked {
            acked.entry(key).or_default().extend(seqs);
        }
        for (conv, seqs) in l.delivered {
            delivered.insert((me as u32, conv), seqs);
        }
    }
    let mut v = check_all(acked, delivered);
    v.wrong_conversation += wrong;
    v
}

/// A connection's end of run: from its stop it drains its unacked sends, then
/// publishes its acks to the run's [`Expect`] (once, counting what stayed unacked), then
/// waits for what it is owed; each wait is bounded by the drain time.
#[derive(Debug)]
pub struct Ending<'a> {
    me: usize,
    drain: Duration,
    unacked_at_end: &'a Counter,
    expect: &'a Expect,
    stopped_at: Option<Instant>,
    published: bool,
}

impl<'a> Ending<'a> {
    /// The end of run of connection `me`, each of its waits at most `drain`; it counts
    /// its unacked sends in `unacked_at_end` and publishes its acks to `expect`.
    pub fn new(
        me: usize,
        drain: Duration,
        unacked_at_end: &'a Counter,
        expect: &'a Expect,
    ) -> Self {
        Ending {
            me,
            drain,
            unacked_at_end,
            expect,
            stopped_at: None,
            published: false,
        }
    }

    /// Moves on at `now` (`stopping`: the connection sends no more; `unacked`: its sends
    /// not acked yet, counted when it publishes `ledger`); true once it is done.
    pub fn done(&mut self, now: Instant, stopping: bool, unacked: usize, ledger: &Ledger) -> bool {
        if stopping && self.stopped_at.is_none() {
            self.stopped_at = Some(now);
        }
        let Some(stop) = self.stopped_at else {
            return false;
        };
        if !self.published && (unacked == 0 || now >= stop + self.drain) {
            self.publish(unacked, ledger);
        }
        self.published && (self.expect.caught_up(self.me, ledger) || now >= stop + self.drain * 2)
    }

    /// Publishes the acks in `ledger` now (and counts `unacked`), unless done already (a
    /// connection that ended early).
    pub fn publish(&mut self, unacked: usize, ledger: &Ledger) {
        if !self.published {
            self.unacked_at_end.add(unacked as u64);
            ledger.publish(self.expect);
            self.published = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::scenarios::test_message as msg;

    #[test]
    fn ledgers_expect_and_check() {
        let expect = Expect::new(2);
        let (mut a, mut b) = (Ledger::default(), Ledger::default());
        let conv = im_proto::direct_conversation("a", "b");
        a.acked(1, &conv, 1);
        a.acked(1, &conv, 3);
        b.acked(0, &conv, 2);
        assert!(b.delivered("b", &msg(&conv, 1)));
        assert!(a.delivered("a", &msg(&conv, 2)));
        assert!(!a.delivered("a", &msg("u:x:y", 1)));
        a.publish(&expect);
        assert!(!expect.caught_up(1, &b));
        b.publish(&expect);
        assert!(expect.caught_up(0, &a));
        assert!(!expect.caught_up(1, &b));
        b.delivered("b", &msg(&conv, 3));
        assert!(expect.caught_up(1, &b));
        let v = verdict(vec![a, b]);
        assert_eq!((v.acked, v.missing, v.wrong_conversation), (3, 0, 1));
        assert!(!v.passed());
    }

    #[test]
    fn group_messages_are_owed_to_every_other_member() {
        // Three members; member 0 sends seq 1 and 2, so 1 and 2 are owed each other one.
        let expect = Expect::new(3);
        let mut ls: Vec<Ledger> = (0..3).map(|_| Ledger::default()).collect();
        let conv = im_proto::group_conversation("g1");
        for seq in [1, 2] {
            for m in [1, 2] {
                ls[0].acked(m, &conv, seq);
            }
        }
        assert!(ls[1].delivered_if(&msg(&conv, 1), true));
        assert!(ls[1].delivered_if(&msg(&conv, 2), true));
        assert!(ls[2].delivered_if(&msg(&conv, 2), true));
        assert!(!ls[2].delivered_if(&msg("g:other", 1), false));
        for l in &ls {
            l.publish(&expect);
        }
        assert!(expect.caught_up(1, &ls[1]));
        assert!(expect.caught_up(2, &ls[2]));
        ls[1].delivered_if(&msg(&conv, 4), true);
        ls[1].delivered_if(&msg(&conv, 3), true);
        assert_eq!(ls[1].sort_deliveries(|c| c.starts_with("g:")), 1);
        assert_eq!(ls[1].sort_deliveries(|c| c.starts_with("g:")), 0);
        let v = verdict(ls);
        // Seq 1 never reached member 2; a delivery outside the member's groups counts too.
        assert_eq!((v.acked, v.missing, v.wrong_conversation), (4, 1, 1));
        assert!(!v.passed());
    }
}
