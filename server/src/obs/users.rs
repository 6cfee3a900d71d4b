//! Users: the per-user diagnosis state behind `GET /admin/v1/users/{uid}` ("why is this
//! user not getting messages?"). It owns, per user, a fixed-size ring of the messages
//! the user sent and received through this node (`obs.user_diag_ring`), kept only for
//! *tracked* users: those under a per-uid log filter ([`super::logfilter`]) and, with
//! `obs.user_diag_sample_every` = N > 0, every Nth user id by hash. It also counts the
//! refusals sent to any user's connections (per error code, with the last time), the
//! RATE_LIMITED ones and the flood closes: those are off the hot path (each one already
//! queues an Error frame), so they are kept for every user. At most
//! `obs.user_diag_max_users` users are held; the one touched longest ago goes first.
//!
//! Cost on the message path: [`UserDiag::tracking`] is one relaxed load (no log filter
//! set) and one integer test (sampling off) when nobody is tracked; the router calls it
//! once per message and looks at the users only when it says someone may be.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use im_admin_api::{StageTiming, UserMessage, UserRefusal};

use super::logfilter;

/// Whether a recorded message was sent or received by the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The user sent it (recorded when it was committed and routed).
    Sent,
    /// It was routed to the user.
    Received,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Sent => "sent",
            Direction::Received => "received",
        }
    }
}

/// One message as the ring keeps it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Sent or received.
    pub direction: Direction,
    /// The message id (empty when unknown, e.g. a sync hint from another node).
    pub msg_id: String,
    /// The conversation.
    pub conversation_id: String,
    /// Its seq (0 when unknown).
    pub seq: u64,
    /// How it reached the user's sessions here (`push`, `sync_hint`, `not_here`,
    /// `committed`).
    pub how: &'static str,
    /// The user's sessions here when it was routed.
    pub sessions: u32,
    /// Stage timings known for it: (stage, milliseconds).
    pub stages: Vec<(&'static str, f64)>,
}

/// The state of one user.
#[derive(Default)]
struct Entry {
    /// Position in [`Table::order`].
    touched: u64,
    messages: VecDeque<(i64, Recorded)>,
    /// Per error code name: (count, last unix ms).
    refusals: Vec<(&'static str, u64, i64)>,
    rate_limited: u64,
    floods: u64,
}

#[derive(Default)]
struct Table {
    users: HashMap<Arc<str>, Entry>,
    /// Touch order: the smallest key is the user touched longest ago.
    order: BTreeMap<u64, Arc<str>>,
    clock: u64,
}

impl Table {
    /// The entry of `uid`, created (evicting the oldest when full) and marked touched.
    fn entry(&mut self, uid: &str, max_users: usize) -> &mut Entry {
        self.clock += 1;
        let now = self.clock;
        if let Some((key, e)) = self.users.get_key_value(uid) {
            let key = key.clone();
            let old = e.touched;
            self.order.remove(&old);
            self.order.insert(now, key);
        } else {
            while self.users.len() >= max_users.max(1) {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                self.users.remove(&oldest);
            }
            let key: Arc<str> = Arc::from(uid);
            self.order.insert(now, key.clone());
            self.users.insert(key, Entry::default());
        }
        let e = self
            .users
            .get_mut(uid)
            .expect("the entry was found or inserted just above");
        e.touched = now;
        e
    }
}

/// The per-user diagnosis of one node (shared by the router, the gateway and the admin
/// API).
pub struct UserDiag {
    ring: usize,
    sample_every: u64,
    max_users: usize,
    hasher: std::hash::RandomState,
    table: Mutex<Table>,
}

/// Which users are tracked right now, for the users of one message
/// ([`UserDiag::tracking`]).
pub struct Tracking<'a> {
    diag: &'a UserDiag,
    filtered: Option<Arc<HashMap<Arc<str>, u8>>>,
}

impl Tracking<'_> {
    /// Whether `uid` is tracked (under a log filter or sampled).
    pub fn tracked(&self, uid: &str) -> bool {
        self.filtered.as_ref().is_some_and(|f| f.contains_key(uid)) || self.diag.sampled(uid)
    }
}

/// One user's figures, as the admin API shows them.
#[derive(Debug, Clone, Default)]
pub struct UserFigures {
    /// Refusals per code, most first.
    pub refusals: Vec<UserRefusal>,
    /// RATE_LIMITED refusals.
    pub rate_limited: u64,
    /// Flood closes.
    pub floods: u64,
    /// Recent messages, newest first.
    pub messages: Vec<UserMessage>,
}

impl UserDiag {
    /// A diagnosis keeping `ring` messages per tracked user, tracking every
    /// `sample_every`th uid by hash (0: none) besides the filtered ones, and at most
    /// `max_users` users.
    pub fn new(ring: u32, sample_every: u32, max_users: u32) -> Arc<Self> {
        Arc::new(UserDiag {
            ring: ring.max(1) as usize,
            sample_every: sample_every.into(),
            max_users: max_users.max(1) as usize,
            hasher: std::hash::RandomState::new(),
            table: Mutex::new(Table::default()),
        })
    }

    /// `obs.user_diag_ring`.
    pub fn ring_size(&self) -> usize {
        self.ring
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `uid` is sampled (`obs.user_diag_sample_every`).
    fn sampled(&self, uid: &str) -> bool {
        if self.sample_every == 0 {
            return false;
        }
        let mut h = self.hasher.build_hasher();
        h.write(uid.as_bytes());
        h.finish().is_multiple_of(self.sample_every)
    }

    /// The hot path's one check: `None` (one relaxed load and an integer test) while no
    /// user can be tracked; else what says which ones are.
    pub fn tracking(&self) -> Option<Tracking<'_>> {
        let filtered = logfilter::filtered_uids();
        if filtered.is_none() && self.sample_every == 0 {
            return None;
        }
        Some(Tracking {
            diag: self,
            filtered,
        })
    }

    /// Whether `uid` is tracked now.
    pub fn tracked(&self, uid: &str) -> bool {
        self.tracking().is_some_and(|t| t.tracked(uid))
    }

    /// Files a message in `uid`'s ring (the caller checked that `uid` is tracked).
    pub fn record(&self, uid: &str, rec: Recorded) {
        let at = im_proto::now_ms();
        let (ring, max) = (self.ring, self.max_users);
        let mut t = self.table();
        let e = t.entry(uid, max);
        if e.messages.len() >= ring {
            e.messages.pop_front();
        }
        e.messages.push_back((at, rec));
    }

    /// Counts a refusal sent to `uid` (any user: refusals are off the hot path).
    pub fn refused(&self, uid: &str, code: im_proto::ErrorCode) {
        let name = code.as_str_name();
        let at = im_proto::now_ms();
        let max = self.max_users;
        let mut t = self.table();
        let e = t.entry(uid, max);
        if code == im_proto::ErrorCode::RateLimited {
            e.rate_limited += 1;
        }
        match e.refusals.iter_mut().find(|r| r.0 == name) {
            Some(r) => {
                r.1 += 1;
                r.2 = at;
            }
            None => e.refusals.push((name, 1, at)),
        }
    }

    /// Counts a connection of `uid` closed for flooding.
    pub fn flooded(&self, uid: &str) {
        let max = self.max_users;
        self.table().entry(uid, max).floods += 1;
    }

    /// Users held now.
    pub fn len(&self) -> usize {
        self.table().users.len()
    }

    /// Whether no user is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `uid`'s figures: refusals, counts and the `messages` most recent messages,
    /// newest first, each naming `node`.
    pub fn figures(&self, uid: &str, node: &str, messages: usize) -> UserFigures {
        let t = self.table();
        let Some(e) = t.users.get(uid) else {
            return UserFigures::default();
        };
        let mut refusals: Vec<UserRefusal> = e
            .refusals
            .iter()
            .map(|(code, count, last_ms)| UserRefusal {
                code: (*code).to_owned(),
                count: *count,
                last_ms: *last_ms,
            })
            .collect();
        refusals.sort_by(|a, b| b.count.cmp(&a.count).then(a.code.cmp(&b.code)));
        UserFigures {
            refusals,
            rate_limited: e.rate_limited,
            floods: e.floods,
            messages: e
                .messages
                .iter()
                .rev()
                .take(messages)
                .map(|(at_ms, r)| UserMessage {
                    direction: r.direction.name().to_owned(),
                    node: node.to_owned(),
                    msg_id: r.msg_id.clone(),
                    conversation_id: r.conversation_id.clone(),
                    seq: r.seq,
                    at_ms: *at_ms,
                    how: r.how.to_owned(),
                    sessions: r.sessions,
                    stages: r
                        .stages
                        .iter()
                        .map(|(stage, ms)| StageTiming {
                            stage: (*stage).to_owned(),
                            ms: (ms * 1000.0).round() / 1000.0,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> Recorded {
        Recorded {
            direction: Direction::Sent,
            msg_id: format!("m{seq}"),
            conversation_id: "u:a:b".into(),
            seq,
            how: "committed",
            sessions: 0,
            stages: vec![("read_to_route", 1.5)],
        }
    }

    #[test]
    fn ring_keeps_the_newest_and_users_are_bounded() {
        let d = UserDiag::new(3, 0, 2);
        for seq in 1..=5 {
            d.record("a", rec(seq));
        }
        let f = d.figures("a", "n1", 10);
        let seqs: Vec<u64> = f.messages.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [5, 4, 3]);
        assert_eq!(f.messages[0].node, "n1");
        assert_eq!(f.messages[0].stages[0].stage, "read_to_route");
        assert_eq!(d.figures("a", "n1", 1).messages.len(), 1);
        // A third user evicts the one touched longest ago.
        d.record("b", rec(1));
        d.record("a", rec(6));
        d.record("c", rec(1));
        assert_eq!(d.len(), 2);
        assert!(d.figures("b", "n1", 10).messages.is_empty());
        assert_eq!(d.figures("a", "n1", 10).messages.len(), 3);
    }

    #[test]
    fn refusals_and_floods_count_per_code() {
        let d = UserDiag::new(4, 0, 10);
        d.refused("u", im_proto::ErrorCode::NotMember);
        d.refused("u", im_proto::ErrorCode::RateLimited);
        d.refused("u", im_proto::ErrorCode::RateLimited);
        d.flooded("u");
        let f = d.figures("u", "n", 10);
        assert_eq!(f.rate_limited, 2);
        assert_eq!(f.floods, 1);
        assert_eq!(f.refusals[0].code, "RATE_LIMITED");
        assert_eq!(f.refusals[0].count, 2);
        assert_eq!(f.refusals[1].code, "NOT_MEMBER");
        assert!(f.refusals[1].last_ms > 0);
        assert!(f.messages.is_empty());
    }

    #[test]
    fn nobody_is_tracked_without_filters_or_sampling() {
        let off = UserDiag::new(4, 0, 10);
        assert!(off.tracking().is_none() || !off.tracked("anyone"));
        let all = UserDiag::new(4, 1, 10);
        assert!(all.tracked("anyone"));
    }
}
