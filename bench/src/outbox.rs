//! One connection's sending side, shared by the scenarios: the [`Outbox`] of un-acked
//! sends and the [`Pacer`] that spaces sends at a rate.
//!
//! Every Send gets a unique client_msg_id ([`crate::wire::client_msg_id`]: run id and
//! message number) and its frame's `req_id` is the message number, so a SendAck or an
//! Error maps back to its send without a lookup table. `OVERLOADED` and `RATE_LIMITED`
//! are retried after `retry_after_ms` with the same client_msg_id (latency still counts
//! from the first attempt); other refusals fail the send. A send with neither an ack nor
//! an error within the ack timeout is given up on. After a reconnect every un-acked send
//! is sent again with its client_msg_id: the server answers a committed one with
//! `duplicate = true` and its original seq, and stores and delivers it once.

use std::sync::Arc;
use std::time::Duration;

use im_proto::{ErrorCode, MessageType};
use tokio::time::Instant;

use crate::wire::{self, Dest};

/// Smallest wait before a retry.
const MIN_RETRY: Duration = Duration::from_millis(1);
/// How far a [`Pacer`] may fall behind before it stops trying to catch up.
const MAX_LAG: Duration = Duration::from_secs(1);

/// Where a send goes (owned, cheap to clone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A one-to-one message to this user.
    User(Arc<str>),
    /// A group message.
    Group(Arc<str>),
}

impl Target {
    fn dest(&self) -> Dest<'_> {
        match self {
            Target::User(u) => Dest::User(u),
            Target::Group(g) => Dest::Group(g),
        }
    }
}

/// What to send: target, type, payload size, and a caller's tag carried to the ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendSpec {
    /// Recipient.
    pub target: Target,
    /// Message type.
    pub msg_type: MessageType,
    /// Payload bytes (at least the 8-byte timestamp).
    pub payload_len: usize,
    /// The caller's tag (e.g. an index of the conversation or recipient).
    pub tag: u32,
}

/// One send waiting for its ack.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Message number (also the frame's req_id).
    pub n: u64,
    /// What was sent.
    pub spec: SendSpec,
    /// When the first attempt was written.
    pub first_sent: Instant,
    /// Payload timestamp of the first attempt (µs since the run's base).
    pub first_sent_us: u64,
    /// When the last attempt was written (the ack timeout runs from here).
    pub last_sent: Instant,
    /// Set after OVERLOADED / RATE_LIMITED: when to resend.
    pub retry_at: Option<Instant>,
    /// Attempts written so far.
    pub attempts: u32,
}

/// What a refusal did to its send.
#[derive(Debug)]
pub enum Refused {
    /// It will be retried (OVERLOADED or RATE_LIMITED).
    Retry,
    /// It failed for good.
    Failed(Pending),
    /// The error was not about a pending send (e.g. req_id 0).
    Unknown,
}

/// The un-acked sends of one connection.
#[derive(Debug)]
pub struct Outbox {
    run_id: u64,
    next_n: u64,
    ack_timeout: Duration,
    pending: Vec<Pending>,
}

impl Outbox {
    /// An empty outbox; client_msg_ids are built from `run_id`.
    pub fn new(run_id: u64, ack_timeout: Duration) -> Self {
        Outbox {
            run_id,
            next_n: 1,
            ack_timeout,
            pending: Vec::new(),
        }
    }

    /// Sends waiting for an ack.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing waits for an ack.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The pending sends.
    pub fn pending(&self) -> &[Pending] {
        &self.pending
    }

    fn encode(&self, p: &Pending) -> Vec<u8> {
        let id = wire::client_msg_id(self.run_id, p.n);
        wire::encode_send_to(
            p.n,
            p.spec.target.dest(),
            p.spec.msg_type,
            &id,
            p.spec.payload_len,
            p.first_sent_us,
        )
    }

    /// Registers a new send at `now` (`now_us` goes into the payload) and returns the
    /// frame to write.
    pub fn start(&mut self, spec: SendSpec, now: Instant, now_us: u64) -> Vec<u8> {
        let n = self.next_n;
        self.next_n += 1;
        let p = Pending {
            n,
            spec,
            first_sent: now,
            first_sent_us: now_us,
            last_sent: now,
            retry_at: None,
            attempts: 1,
        };
        let frame = self.encode(&p);
        self.pending.push(p);
        frame
    }

    /// Removes and returns the send `req_id` answers (on its SendAck).
    pub fn take(&mut self, req_id: u64) -> Option<Pending> {
        let idx = self.pending.iter().position(|p| p.n == req_id)?;
        Some(self.pending.swap_remove(idx))
    }

    /// Handles an `Error` for `req_id`: schedules a retry or fails the send.
    pub fn refused(&mut self, req_id: u64, e: &im_proto::Error, now: Instant) -> Refused {
        let Some(idx) = self.pending.iter().position(|p| p.n == req_id) else {
            return Refused::Unknown;
        };
        let retryable =
            e.code == ErrorCode::Overloaded as i32 || e.code == ErrorCode::RateLimited as i32;
        if retryable {
            let wait = Duration::from_millis(u64::from(e.retry_after_ms)).max(MIN_RETRY);
            self.pending[idx].retry_at = Some(now + wait);
            Refused::Retry
        } else {
            Refused::Failed(self.pending.swap_remove(idx))
        }
    }

    /// The frames of the retries due at `now` (each marked as sent again).
    pub fn due_retries(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for i in 0..self.pending.len() {
            if self.pending[i].retry_at.is_some_and(|at| at <= now) {
                let p = &mut self.pending[i];
                p.retry_at = None;
                p.last_sent = now;
                p.attempts += 1;
                frames.push(self.encode(&self.pending[i]));
            }
        }
        frames
    }

    /// The frames of every pending send, for a new connection (each marked as sent again).
    pub fn resend_all(&mut self, now: Instant) -> Vec<Vec<u8>> {
        for p in &mut self.pending {
            p.retry_at = None;
            p.last_sent = now;
            p.attempts += 1;
        }
        self.pending.iter().map(|p| self.encode(p)).collect()
    }

    /// Removes and returns the sends whose ack timed out (not those waiting to retry).
    pub fn expired(&mut self, now: Instant) -> Vec<Pending> {
        let timeout = self.ack_timeout;
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            if p.retry_at.is_none() && now.saturating_duration_since(p.last_sent) >= timeout {
                out.push(self.pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        out
    }

    /// The earliest retry time, if any send waits for one.
    pub fn next_retry(&self) -> Option<Instant> {
        self.pending.iter().filter_map(|p| p.retry_at).min()
    }
}

/// Spaces events at a fixed rate: [`Pacer::take`] says whether the next one is due.
/// When it falls behind (the caller could not send), it catches up by sending back to
/// back, but never by more than a second's worth.
#[derive(Debug, Clone)]
pub struct Pacer {
    interval: Duration,
    next: Instant,
    skipped: u64,
}

impl Pacer {
    /// A pacer for `per_sec` events per second, the first due at `first`.
    pub fn new(per_sec: f64, first: Instant) -> Self {
        let interval = Duration::from_secs_f64(1.0 / per_sec.max(1e-6));
        Pacer {
            interval,
            next: first,
            skipped: 0,
        }
    }

    /// Sender `i` of `n`'s pacer at `per_sec` each, its first event due at `base` plus
    /// its share of one interval: the senders are staggered over the interval so that
    /// their paced sends do not come in waves.
    pub fn staggered(per_sec: f64, i: usize, n: usize, base: Instant) -> Self {
        let offset = Duration::from_secs_f64(i as f64 / (n as f64 * per_sec));
        Pacer::new(per_sec, base + offset)
    }

    /// The interval between events.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Instant {
        self.next
    }

    /// Events dropped because the caller fell more than a second behind.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Whether an event is due at `now`; if so it is consumed.
    pub fn take(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        let lag = now - self.next;
        if lag > MAX_LAG {
            let behind = (lag.as_secs_f64() / self.interval.as_secs_f64()) as u64;
            self.skipped += behind;
            self.next = now;
        }
        self.next += self.interval;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use im_proto::{Body, Frame, Message as _};

    fn spec() -> SendSpec {
        SendSpec {
            target: Target::User("bob".into()),
            msg_type: MessageType::Text,
            payload_len: 20,
            tag: 3,
        }
    }

    fn err(code: ErrorCode, retry_after_ms: u32) -> im_proto::Error {
        im_proto::Error {
            code: code as i32,
            message: String::new(),
            retry_after_ms,
        }
    }

    #[test]
    fn sends_are_numbered_retried_and_timed_out() {
        let t0 = Instant::now();
        let mut o = Outbox::new(0xabc, Duration::from_secs(1));
        let f1 = o.start(spec(), t0, 5);
        let f2 = o.start(spec(), t0, 6);
        let d1 = Frame::decode(f1.as_slice()).unwrap();
        assert_eq!(d1.req_id, 1);
        assert_eq!(Frame::decode(f2.as_slice()).unwrap().req_id, 2);
        assert_eq!(o.len(), 2);

        assert!(matches!(
            o.refused(1, &err(ErrorCode::Overloaded, 50), t0),
            Refused::Retry
        ));
        assert_eq!(o.next_retry(), Some(t0 + Duration::from_millis(50)));
        assert!(o.due_retries(t0).is_empty());
        let again = o.due_retries(t0 + Duration::from_millis(50));
        assert_eq!(again.len(), 1);
        // The retry is the same message: same client_msg_id, same timestamp.
        assert_eq!(again[0], f1);
        let Some(Body::Send(s)) = d1.body else {
            panic!()
        };
        assert_eq!(s.client_msg_id.as_bytes(), wire::client_msg_id(0xabc, 1));

        assert!(
            matches!(o.refused(2, &err(ErrorCode::NotMember, 0), t0), Refused::Failed(p) if p.n == 2)
        );
        assert!(matches!(
            o.refused(9, &err(ErrorCode::BadFrame, 0), t0),
            Refused::Unknown
        ));

        let expired = o.expired(t0 + Duration::from_millis(1049));
        assert!(expired.is_empty());
        let expired = o.expired(t0 + Duration::from_millis(1050));
        assert_eq!(expired.len(), 1);
        assert!(o.is_empty());

        o.start(spec(), t0, 7);
        let p = o.take(3).unwrap();
        assert_eq!((p.n, p.spec.tag, p.first_sent_us, p.attempts), (3, 3, 7, 1));
        assert!(o.take(3).is_none());

        o.start(spec(), t0, 8);
        let resent = o.resend_all(t0 + Duration::from_secs(3));
        assert_eq!(resent.len(), 1);
        assert_eq!(o.pending()[0].attempts, 2);
    }

    #[test]
    fn pacer_keeps_the_rate_and_bounds_catch_up() {
        let t0 = Instant::now();
        let mut p = Pacer::new(10.0, t0);
        assert!(p.take(t0));
        assert!(!p.take(t0));
        assert!(p.take(t0 + Duration::from_millis(100)));
        // 250 ms late: catches up with back-to-back events.
        let late = t0 + Duration::from_millis(450);
        assert!(p.take(late) && p.take(late) && p.take(late));
        assert!(!p.take(late));
        // 5 s late: no burst of 50, the schedule restarts.
        let later = t0 + Duration::from_secs(6);
        assert!(p.take(later));
        assert!(!p.take(later));
        assert!(p.skipped() >= 50);
    }
}
