//! Presence subscriptions: the one table of which connection watches whose presence
//! (target user -> subscriber connections, connection -> its targets), the hidden flag
//! of each watched user, what each subscriber was last shown of a user (so a change is
//! pushed once, and only when what they see changes) and the last-seen times of users
//! who went offline, kept in memory per node and bounded ([`LAST_SEEN_MAX`]).
//!
//! The [`Router`](super::Router) owns the hub: it tells it about every
//! change of a user's device count (its own sessions, and the other nodes' through the
//! cluster's presence map) and hands it the current count, read under the hub's lock so
//! that concurrent changes are applied in order. The hub pushes `Presence` frames
//! straight into the subscribers' outbound queues. Nothing here touches the store: who
//! may be watched and who hides is decided by the pipeline before a subscription.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use im_proto::{frame, Body, Presence};

use crate::flow::Outbound;

/// Most last-seen times kept per node; when full, the oldest eighth is forgotten.
pub const LAST_SEEN_MAX: usize = 100_000;

/// What subscribers see of a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shown {
    online: bool,
    devices: u32,
}

/// One watched user.
struct Watch {
    /// The connections watching them.
    subscribers: Vec<Arc<Outbound>>,
    /// They hide their presence (subscribers see them offline).
    hidden: bool,
    /// What the subscribers were last shown.
    shown: Shown,
}

#[derive(Default)]
struct Inner {
    watched: HashMap<String, Watch>,
    conns: HashMap<u64, Vec<String>>,
    last_seen: HashMap<String, i64>,
}

impl Inner {
    /// Drops `conn_id`'s subscriptions.
    fn drop_conn(&mut self, conn_id: u64) -> usize {
        let Some(targets) = self.conns.remove(&conn_id) else {
            return 0;
        };
        for t in &targets {
            if let Some(w) = self.watched.get_mut(t) {
                w.subscribers.retain(|o| o.conn_id != conn_id);
                if w.subscribers.is_empty() {
                    self.watched.remove(t);
                }
            }
        }
        targets.len()
    }

    fn record_last_seen(&mut self, user: &str, at: i64) {
        if self.last_seen.len() >= LAST_SEEN_MAX && !self.last_seen.contains_key(user) {
            let mut times: Vec<i64> = self.last_seen.values().copied().collect();
            let cut = times.len() / 8;
            times.select_nth_unstable(cut);
            let oldest = times[cut];
            self.last_seen.retain(|_, t| *t > oldest);
        }
        self.last_seen.insert(user.to_owned(), at);
    }

    /// The Presence push of `user` as `shown`.
    fn frame(&self, user: &str, shown: Shown, now: i64) -> Bytes {
        let last_seen = if shown.online {
            now
        } else if shown.devices == 0 && self.watched.get(user).is_some_and(|w| w.hidden) {
            0
        } else {
            self.last_seen.get(user).copied().unwrap_or(0)
        };
        im_proto::encode(&frame(
            0,
            Body::Presence(Presence {
                user_id: user.to_owned(),
                online: shown.online,
                last_seen,
                devices: shown.devices,
            }),
        ))
    }
}

/// What a subscriber sees of a user with `devices` connected devices.
fn shown(devices: u32, hidden: bool) -> Shown {
    if hidden {
        Shown {
            online: false,
            devices: 0,
        }
    } else {
        Shown {
            online: devices > 0,
            devices,
        }
    }
}

/// The presence subscriber table of this node (see the module header).
pub struct PresenceHub {
    inner: Mutex<Inner>,
    pushes: metrics::Counter,
    subscriptions: metrics::Gauge,
}

impl Default for PresenceHub {
    fn default() -> Self {
        Self::new()
    }
}

impl PresenceHub {
    /// An empty table.
    pub fn new() -> Self {
        let pushes = metrics::counter!("im_presence_pushes_total");
        pushes.absolute(0);
        PresenceHub {
            inner: Mutex::new(Inner::default()),
            pushes,
            subscriptions: metrics::gauge!("im_presence_subscriptions"),
        }
    }

    /// Replaces `out`'s subscriptions with `targets` (user, hidden), then pushes each
    /// target's current state to it; `devices` counts a user's devices on every node
    /// (called under the hub's lock). Returns how many it now watches.
    pub fn subscribe(
        &self,
        out: &Arc<Outbound>,
        targets: Vec<(String, bool)>,
        devices: impl Fn(&str) -> u32,
    ) -> usize {
        let Ok(mut inner) = self.inner.lock() else {
            return 0;
        };
        let dropped = inner.drop_conn(out.conn_id);
        let now = im_proto::now_ms();
        let mut users = Vec::with_capacity(targets.len());
        let mut pushed = 0;
        for (user, hidden) in targets {
            if users.contains(&user) {
                continue;
            }
            let s = shown(devices(&user), hidden);
            let w = inner.watched.entry(user.clone()).or_insert_with(|| Watch {
                subscribers: Vec::new(),
                hidden,
                shown: s,
            });
            // The store was just read: its flag is the latest.
            w.hidden = hidden;
            w.subscribers.push(out.clone());
            if w.shown != s {
                // A change nobody was shown yet: everyone watching sees it now.
                w.shown = s;
                let bytes = inner.frame(&user, s, now);
                if let Some(w) = inner.watched.get(&user) {
                    for o in w.subscribers.iter().filter(|o| o.conn_id != out.conn_id) {
                        o.push(bytes.clone(), true);
                        pushed += 1;
                    }
                }
            }
            out.push(inner.frame(&user, s, now), true);
            pushed += 1;
            users.push(user);
        }
        let n = users.len();
        if n > 0 {
            inner.conns.insert(out.conn_id, users);
        }
        self.pushes.increment(pushed);
        self.subscriptions.increment(n as f64 - dropped as f64);
        n
    }

    /// Drops the subscriptions of a connection that ended.
    pub fn drop_conn(&self, conn_id: u64) {
        if let Ok(mut inner) = self.inner.lock() {
            let n = inner.drop_conn(conn_id);
            if n > 0 {
                self.subscriptions.decrement(n as f64);
            }
        }
    }

    /// `user`'s device count may have changed (a connection here or on another node
    /// came or went): `devices` reads it (under the hub's lock). Records the last-seen
    /// time when none is left, and pushes the new state to the user's subscribers when
    /// what they see changed.
    pub fn changed(&self, user: &str, devices: impl FnOnce(&str) -> u32) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let n = devices(user);
        let now = im_proto::now_ms();
        if n == 0 {
            inner.record_last_seen(user, now);
        }
        self.update(&mut inner, user, None, n, now);
    }

    /// `user` hides (or shows again) their presence: their subscribers here see them
    /// offline (or their real state again).
    pub fn set_hidden(&self, user: &str, hidden: bool, devices: impl FnOnce(&str) -> u32) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if !inner.watched.contains_key(user) {
            return;
        }
        let n = devices(user);
        self.update(&mut inner, user, Some(hidden), n, im_proto::now_ms());
    }

    fn update(&self, inner: &mut Inner, user: &str, hidden: Option<bool>, n: u32, now: i64) {
        let Some(w) = inner.watched.get_mut(user) else {
            return;
        };
        // Shown again while offline: same state, but the last seen time is news.
        let unhidden = hidden == Some(false) && w.hidden;
        if let Some(h) = hidden {
            w.hidden = h;
        }
        let s = shown(n, w.hidden);
        if s == w.shown && !unhidden {
            return;
        }
        w.shown = s;
        let bytes = inner.frame(user, s, now);
        let mut pushed = 0;
        if let Some(w) = inner.watched.get(user) {
            for o in &w.subscribers {
                o.push(bytes.clone(), true);
                pushed += 1;
            }
        }
        self.pushes.increment(pushed);
    }

    /// When `user` was last seen going offline by this node (ms), if it knows.
    pub fn last_seen(&self, user: &str) -> Option<i64> {
        self.inner.lock().ok()?.last_seen.get(user).copied()
    }

    /// Connections with a subscription, and users watched.
    pub fn counts(&self) -> (usize, usize) {
        self.inner
            .lock()
            .map(|i| (i.conns.len(), i.watched.len()))
            .unwrap_or((0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::Metrics;
    use im_proto::Frame;
    use prost::Message as _;

    fn conn(id: u64) -> (Arc<Outbound>, crate::flow::OutboundRx) {
        Outbound::new(id, "test".into(), 1 << 20, 2 << 20, Metrics::new(false))
    }

    fn drain(rx: &mut crate::flow::OutboundRx) -> Vec<Presence> {
        let mut out = Vec::new();
        while let Ok(f) = rx.frames.try_recv() {
            match Frame::decode(f.bytes).unwrap().body {
                Some(Body::Presence(p)) => out.push(p),
                other => panic!("{other:?}"),
            }
        }
        out
    }

    #[test]
    fn pushes_state_then_changes_and_hides() {
        let hub = PresenceHub::new();
        let (a, mut arx) = conn(1);
        assert_eq!(hub.subscribe(&a, vec![("bob".into(), false)], |_| 0), 1);
        let p = drain(&mut arx);
        assert_eq!(p.len(), 1);
        assert!(!p[0].online && p[0].last_seen == 0 && p[0].devices == 0);

        hub.changed("bob", |_| 1);
        hub.changed("bob", |_| 1); // no change, no push
        hub.changed("bob", |_| 2);
        let p = drain(&mut arx);
        assert_eq!(p.iter().map(|p| p.devices).collect::<Vec<_>>(), vec![1, 2]);
        assert!(p.iter().all(|p| p.online && p.last_seen > 0));

        hub.set_hidden("bob", true, |_| 2);
        hub.changed("bob", |_| 1);
        let p = drain(&mut arx);
        assert_eq!(p.len(), 1);
        assert!(!p[0].online && p[0].last_seen == 0 && p[0].devices == 0);
        hub.changed("bob", |_| 0);
        assert!(drain(&mut arx).is_empty(), "hidden: no push");
        assert!(hub.last_seen("bob").is_some());
        hub.set_hidden("bob", false, |_| 0);
        let p = drain(&mut arx);
        assert_eq!(p.len(), 1);
        assert!(!p[0].online && p[0].last_seen > 0);

        // Replacing the set, then the connection's end, leave nothing behind.
        assert_eq!(hub.subscribe(&a, vec![("carol".into(), false)], |_| 0), 1);
        drain(&mut arx);
        hub.changed("bob", |_| 1);
        assert!(drain(&mut arx).is_empty());
        hub.drop_conn(1);
        assert_eq!(hub.counts(), (0, 0));
    }

    #[test]
    fn last_seen_is_bounded() {
        let mut inner = Inner::default();
        for i in 0..LAST_SEEN_MAX + 10 {
            inner.record_last_seen(&format!("u{i}"), i as i64);
        }
        assert!(inner.last_seen.len() <= LAST_SEEN_MAX);
        assert!(inner
            .last_seen
            .contains_key(&format!("u{}", LAST_SEEN_MAX + 9)));
        assert!(!inner.last_seen.contains_key("u0"));
    }
}
