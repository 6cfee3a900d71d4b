//! Per-connection frame limits, in one table. Each client frame kind ([`FrameKind`])
//! takes a token from one of the connection's [`Buckets`] (rate and burst from
//! `limits.*`), is refused RATE_LIMITED with its own words when the bucket is empty, and
//! counts those refusals under one flood kind (the `frame` label of
//! `im_flood_disconnects_total`, one of `obs::FLOOD_FRAMES`), which closes the
//! connection 1008 `<kind> flood` past `limits.max_rate_limited` in
//! `limits.rate_limited_window_secs` (the gateway counts). A new frame kind is one row
//! of [`FrameKind::rule`] (and of [`FrameKind::rate`], when it gets a bucket of its
//! own).

use std::sync::Mutex;
use std::time::Instant;

use im_proto::{Body, ErrorCode};

use super::{Refusal, Session};
use crate::config::Limits;
use crate::flow::CloseReason;
use crate::obs::FLOOD_FRAMES;

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    pub(super) at: Instant,
}

impl TokenBucket {
    /// A full bucket; `rate` 0 means unlimited.
    pub fn new(rate: u32, burst: u32) -> Self {
        TokenBucket {
            rate: rate as f64,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            at: Instant::now(),
        }
    }

    /// Takes a token; on refusal returns the milliseconds until one is available.
    pub fn take(&mut self, now: Instant) -> Result<(), u32> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - self.tokens) / self.rate) * 1000.0).ceil().max(1.0) as u32)
        }
    }
}

/// A rate-limited client frame kind. The first [`FrameKind::OWNERS`] kinds have a token
/// bucket of their own; the others share one of theirs ([`Rule::shares`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Ping (`limits.ping_*`).
    Ping,
    /// Send (`limits.send_*`).
    Send,
    /// DeliverAck (`limits.deliver_ack_*`).
    DeliverAck,
    /// SyncRequest (`limits.sync_*`).
    Sync,
    /// GroupOp (`limits.group_op_*`).
    GroupOp,
    /// MarkRead (`limits.mark_read_*`).
    MarkRead,
    /// ListConversations (`limits.list_conversations_*`).
    ListConversations,
    /// SetConversationFlags (`limits.set_flags_*`).
    SetFlags,
    /// PresenceSubscribe (`limits.presence_subscribe_*`).
    PresenceSubscribe,
    /// SetPresence (`limits.set_presence_*`).
    SetPresence,
    /// Typing (`limits.typing_*`).
    Typing,
    /// Recall (the Send bucket).
    Recall,
    /// Edit (the Send bucket).
    Edit,
    /// DeleteForMe (the Send bucket).
    DeleteForMe,
    /// FetchHistory (the SyncRequest bucket).
    FetchHistory,
}

/// A frame kind's row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The kind whose bucket it takes from, when not its own.
    pub shares: Option<FrameKind>,
    /// What its RATE_LIMITED refusal says is done too fast.
    pub what: &'static str,
    /// Its flood kind: the `frame` label (one of `obs::FLOOD_FRAMES`).
    pub flood: &'static str,
    /// The close reason of its flood.
    pub close: &'static str,
}

impl FrameKind {
    /// Every kind, in declaration order (the discriminant is the index): the bucket
    /// owners first.
    pub const ALL: [FrameKind; 15] = [
        FrameKind::Ping,
        FrameKind::Send,
        FrameKind::DeliverAck,
        FrameKind::Sync,
        FrameKind::GroupOp,
        FrameKind::MarkRead,
        FrameKind::ListConversations,
        FrameKind::SetFlags,
        FrameKind::PresenceSubscribe,
        FrameKind::SetPresence,
        FrameKind::Typing,
        FrameKind::Recall,
        FrameKind::Edit,
        FrameKind::DeleteForMe,
        FrameKind::FetchHistory,
    ];

    /// How many kinds own a bucket (the first of [`FrameKind::ALL`]).
    pub const OWNERS: usize = 11;

    /// The table: each kind's shared bucket, refusal words and flood kind.
    pub const fn rule(self) -> Rule {
        const fn own(what: &'static str, flood: &'static str, close: &'static str) -> Rule {
            Rule {
                shares: None,
                what,
                flood,
                close,
            }
        }
        const fn shares(kind: FrameKind, what: &'static str) -> Rule {
            let mut r = kind.rule();
            r.shares = Some(kind);
            r.what = what;
            r
        }
        use FrameKind as K;
        match self {
            K::Ping => own("pinging", "ping", "ping flood"),
            K::Send => own("sending", "send", "send flood"),
            K::DeliverAck => own("acking", "deliver_ack", "deliver_ack flood"),
            K::Sync => own("syncing", "sync", "sync flood"),
            K::GroupOp => own("changing groups", "group_op", "group_op flood"),
            K::MarkRead => own("marking read", "mark_read", "mark_read flood"),
            K::ListConversations => own(
                "listing conversations",
                "conversations",
                "conversations flood",
            ),
            K::SetFlags => own(
                "setting conversation flags",
                "conversations",
                "conversations flood",
            ),
            K::PresenceSubscribe => own("subscribing to presence", "presence", "presence flood"),
            K::SetPresence => own("setting presence", "presence", "presence flood"),
            K::Typing => own("typing notices", "typing", "typing flood"),
            K::Recall => shares(K::Send, "recalling"),
            K::Edit => shares(K::Send, "editing"),
            K::DeleteForMe => shares(K::Send, "deleting"),
            K::FetchHistory => shares(K::Sync, "fetching history"),
        }
    }

    /// The rate per second and burst of the bucket it takes from.
    pub fn rate(self, l: &Limits) -> (u32, u32) {
        use FrameKind as K;
        match self.rule().shares.unwrap_or(self) {
            K::Ping => (l.ping_rate_per_sec, l.ping_burst),
            K::Send | K::Recall | K::Edit | K::DeleteForMe => (l.send_rate_per_sec, l.send_burst),
            K::DeliverAck => (l.deliver_ack_rate_per_sec, l.deliver_ack_burst),
            K::Sync | K::FetchHistory => (l.sync_rate_per_sec, l.sync_burst),
            K::GroupOp => (l.group_op_rate_per_sec, l.group_op_burst),
            K::MarkRead => (l.mark_read_rate_per_sec, l.mark_read_burst),
            K::ListConversations => (
                l.list_conversations_rate_per_sec,
                l.list_conversations_burst,
            ),
            K::SetFlags => (l.set_flags_rate_per_sec, l.set_flags_burst),
            K::PresenceSubscribe => (
                l.presence_subscribe_rate_per_sec,
                l.presence_subscribe_burst,
            ),
            K::SetPresence => (l.set_presence_rate_per_sec, l.set_presence_burst),
            K::Typing => (l.typing_rate_per_sec, l.typing_burst),
        }
    }

    /// A full bucket at its configured rate.
    pub fn full_bucket(self, l: &Limits) -> TokenBucket {
        let (rate, burst) = self.rate(l);
        TokenBucket::new(rate, burst)
    }

    /// The index of the bucket it takes from in a connection's [`Buckets`].
    const fn slot(self) -> usize {
        match self.rule().shares {
            Some(owner) => owner as usize,
            None => self as usize,
        }
    }

    /// The kind of a client frame, if it is rate-limited.
    pub fn of(body: &Body) -> Option<FrameKind> {
        Some(match body {
            Body::Ping(_) => FrameKind::Ping,
            Body::Send(_) => FrameKind::Send,
            Body::Recall(_) => FrameKind::Recall,
            Body::Edit(_) => FrameKind::Edit,
            Body::DeleteForMe(_) => FrameKind::DeleteForMe,
            Body::DeliverAck(_) => FrameKind::DeliverAck,
            Body::Sync(_) => FrameKind::Sync,
            Body::FetchHistory(_) => FrameKind::FetchHistory,
            Body::GroupOp(_) => FrameKind::GroupOp,
            Body::MarkRead(_) => FrameKind::MarkRead,
            Body::ListConversations(_) => FrameKind::ListConversations,
            Body::SetConversationFlags(_) => FrameKind::SetFlags,
            Body::PresenceSubscribe(_) => FrameKind::PresenceSubscribe,
            Body::SetPresence(_) => FrameKind::SetPresence,
            Body::Typing(_) => FrameKind::Typing,
            _ => return None,
        })
    }

    /// Its RATE_LIMITED refusal, with the wait until a token is back.
    pub fn refusal(self, retry_after_ms: u32) -> Refusal {
        Refusal {
            code: ErrorCode::RateLimited,
            message: format!("{} too fast", self.rule().what),
            retry_after_ms,
            bad_reason: Some("rate_limited"),
        }
    }

    /// Its flood kind's position in `obs::FLOOD_FRAMES` (the gateway's window of it).
    pub fn flood_index(self) -> usize {
        let label = self.rule().flood;
        FLOOD_FRAMES.iter().position(|f| *f == label).unwrap_or(0)
    }

    /// The close of a connection that flooded with this kind (1008).
    pub fn flood_close(self) -> CloseReason {
        CloseReason::new(CloseReason::POLICY, self.rule().close)
    }
}

/// A connection's buckets: one per bucket-owning [`FrameKind`] it has taken a token of,
/// each made full at the first take (a bucket never taken from is full), so a connection
/// holds room only for the kinds it sends (an idle one: its Pings').
#[derive(Debug, Default)]
pub struct Buckets(Mutex<Vec<(u8, TokenBucket)>>);

impl Session {
    /// Takes a token of `kind`'s bucket (rates from `l`, the node's limits); its
    /// RATE_LIMITED refusal when it is empty.
    pub fn take(&self, kind: FrameKind, l: &Limits) -> Result<(), Refusal> {
        let now = Instant::now();
        let Ok(mut b) = self.buckets.0.lock() else {
            return Ok(());
        };
        let slot = kind.slot();
        let i = match b.iter().position(|(s, _)| usize::from(*s) == slot) {
            Some(i) => i,
            None => {
                // Exact room: a connection uses few kinds, most only one or two.
                b.reserve_exact(1);
                b.push((slot as u8, FrameKind::ALL[slot].full_bucket(l)));
                b.len() - 1
            }
        };
        b[i].1.take(now).map_err(|ms| kind.refusal(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_allows_burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        assert!((0..3).all(|_| b.take(t0).is_ok()));
        let wait = b.take(t0).unwrap_err();
        assert!((1..=100).contains(&wait), "{wait}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
        let mut free = TokenBucket::new(0, 1);
        assert!((0..1000).all(|_| free.take(t0).is_ok()));
    }

    #[test]
    fn the_table_names_every_flood_kind_and_bucket() {
        for (i, k) in FrameKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?} out of order");
            let owner = i < FrameKind::OWNERS;
            assert_eq!(k.rule().shares.is_none(), owner, "{k:?}");
            assert!(k.slot() < FrameKind::OWNERS, "{k:?}");
        }
        for k in FrameKind::ALL {
            let rule = k.rule();
            assert!(FLOOD_FRAMES.contains(&rule.flood), "{k:?}: {}", rule.flood);
            assert_eq!(rule.close, format!("{} flood", rule.flood), "{k:?}");
            assert_eq!(FLOOD_FRAMES[k.flood_index()], rule.flood);
        }
        for label in FLOOD_FRAMES {
            assert!(
                FrameKind::ALL.iter().any(|k| k.rule().flood == label),
                "no frame kind floods as {label}"
            );
        }
    }

    #[test]
    fn a_refusal_names_the_frame_and_the_wait() {
        let r = FrameKind::FetchHistory.refusal(7);
        assert_eq!(r.code, ErrorCode::RateLimited);
        assert_eq!(r.message, "fetching history too fast");
        assert_eq!(r.retry_after_ms, 7);
        assert_eq!(r.bad_reason, Some("rate_limited"));
    }
}
