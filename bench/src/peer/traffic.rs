//! What the peer modes share: the payload (send time, sequence number, sender), the
//! per-sender sequence check, opening many connections of any protocol, and the
//! receiving and sending loops of `broadcast` and `pairs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::conn::{Dest, Event, Opener, PeerConn};
use super::Protocol;
use crate::clock::Clock;
use crate::report::line;
use crate::stats::{LatencyRecorder, Summary};
use crate::target::{source_ips, Target};

/// Keepalive interval of an idle connection (below im's and MQTT's timeouts).
pub(super) const KEEPALIVE: Duration = Duration::from_secs(10);
/// Connections opened at the same time.
const CONNECT_CONCURRENCY: usize = 64;
/// Payload header: send time (µs, u64 LE), sequence number (u64 LE), sender (u32 LE).
pub const PAYLOAD_HEADER: usize = 20;
/// Highest sequence number a receiver tracks (bounds its memory).
const MAX_SEQ: u64 = 10_000_000;

/// A payload of `size` bytes: send time (µs from the run's base), sequence number,
/// sender index, then filler.
pub fn encode_payload(sent_us: u64, seq: u64, sender: u32, size: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(size.max(PAYLOAD_HEADER));
    p.extend_from_slice(&sent_us.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&sender.to_le_bytes());
    p.resize(size.max(PAYLOAD_HEADER), b'x');
    p
}

/// `(sent_us, seq, sender)` of a payload made by [`encode_payload`].
pub fn decode_payload(p: &[u8]) -> Option<(u64, u64, u32)> {
    let sent = u64::from_le_bytes(p.get(0..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(p.get(8..16)?.try_into().ok()?);
    let sender = u32::from_le_bytes(p.get(16..20)?.try_into().ok()?);
    Some((sent, seq, sender))
}

/// One receiver's view of one sender's sequence numbers (1, 2, ...).
#[derive(Debug, Default, Clone)]
pub struct SeqCheck {
    seen: Vec<bool>,
    /// Distinct sequence numbers received.
    pub distinct: u64,
    /// Copies of a sequence number already received.
    pub duplicates: u64,
    /// Arrivals below the highest received so far.
    pub reordered: u64,
    /// Payloads that do not parse or carry a sequence number out of range.
    pub bad: u64,
    /// Highest received.
    pub highest: u64,
}

impl SeqCheck {
    /// Takes one received sequence number.
    pub fn take(&mut self, seq: u64) {
        if seq == 0 || seq > MAX_SEQ {
            self.bad += 1;
            return;
        }
        let i = seq as usize;
        if self.seen.len() <= i {
            self.seen.resize(i + 1, false);
        }
        if self.seen[i] {
            self.duplicates += 1;
            return;
        }
        self.seen[i] = true;
        self.distinct += 1;
        if seq < self.highest {
            self.reordered += 1;
        }
        self.highest = self.highest.max(seq);
    }

    /// Messages of 1..=sent never received.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.distinct)
    }
}

/// The delivery check over all receivers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Delivery {
    /// Deliveries expected (messages sent × receivers each is for).
    pub expected: u64,
    /// Distinct deliveries.
    pub delivered: u64,
    /// Expected but never delivered.
    pub lost: u64,
    /// Delivered more than once.
    pub duplicates: u64,
    /// Delivered after a later message.
    pub reordered: u64,
    /// Payloads that did not parse, or from the wrong sender.
    pub bad: u64,
    /// Whether losses are a failure for this protocol and path.
    pub losses_fail: bool,
}

impl Delivery {
    pub(super) fn add(&mut self, c: &SeqCheck, sent: u64) {
        self.expected += sent;
        self.delivered += c.distinct;
        self.lost += c.lost(sent);
        self.duplicates += c.duplicates;
        self.reordered += c.reordered;
        self.bad += c.bad;
    }

    /// Whether the check passed.
    pub fn passed(&self) -> bool {
        self.duplicates == 0
            && self.reordered == 0
            && self.bad == 0
            && (self.lost == 0 || !self.losses_fail)
    }

    pub(super) fn lines(&self, s: &mut String) {
        line(
            s,
            "delivery",
            format!(
                "{} of {} expected, lost {}{}, duplicates {}, reordered {}, bad {}",
                self.delivered,
                self.expected,
                self.lost,
                if self.losses_fail {
                    ""
                } else {
                    " (allowed: at-most-once)"
                },
                self.duplicates,
                self.reordered,
                self.bad
            ),
        );
    }
}

// ---------------------------------------------------------------------------------
// Connecting

pub(super) fn opener(protocol: Protocol, target: &Target, sources: u32) -> Opener {
    Opener {
        protocol,
        url: target.url.clone(),
        addr: target.addr,
        sources: source_ips(target.addr, sources),
        dialer: target.dialer(),
    }
}

/// Opens one connection per name (connection numbers from `first`), each subscribed
/// to its topic from `topic(i)` at `qos`; returns them in order and the connect times.
pub(super) async fn open_all(
    opener: &Opener,
    names: &[String],
    first: usize,
    topics: Vec<Option<String>>,
    qos: u8,
) -> anyhow::Result<(Vec<PeerConn>, Summary)> {
    let limit = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let times = Arc::new(LatencyRecorder::new(16));
    let mut set = JoinSet::new();
    for (i, (name, topic)) in names.iter().zip(topics).enumerate() {
        let (opener, name, limit, times) =
            (opener.clone(), name.clone(), limit.clone(), times.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let t0 = Instant::now();
            let mut c = opener
                .open(first + i, &name)
                .await
                .with_context(|| format!("opening {name}"))?;
            if let Some(t) = topic {
                c.subscribe(&t, qos)
                    .await
                    .with_context(|| format!("{name} subscribing to {t}"))?;
            }
            times.record(i, t0.elapsed().as_micros() as u64);
            anyhow::Ok((i, c))
        });
    }
    let mut slots: Vec<Option<PeerConn>> = (0..names.len()).map(|_| None).collect();
    let mut done = 0usize;
    while let Some(joined) = set.join_next().await {
        let (i, c) = joined.context("connect task panicked")??;
        slots[i] = Some(c);
        done += 1;
        if done.is_multiple_of(1000) {
            eprintln!("im-bench peer: {done}/{} connected", names.len());
        }
    }
    Ok((
        slots.into_iter().flatten().collect(),
        Summary::of(&times.snapshot()),
    ))
}

/// What the receivers share.
pub(super) struct Receivers {
    pub(super) clock: Clock,
    pub(super) latency: LatencyRecorder,
    /// Deliveries that arrived in the measured window.
    pub(super) in_window: AtomicU64,
    /// Final sequence number of each sender, once it stopped (0: still sending).
    pub(super) final_seq: Vec<AtomicU64>,
    /// Senders that stopped.
    pub(super) senders_done: AtomicU64,
}

/// Receives until the sender `sender` has stopped and this receiver has its last
/// message, or `deadline`. Returns the sender's index and the receiver's check.
pub(super) async fn receive(
    mut conn: PeerConn,
    i: usize,
    sender: u32,
    shared: Arc<Receivers>,
    deadline: Instant,
) -> (u32, SeqCheck) {
    let mut check = SeqCheck::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_keepalive = Instant::now();
    loop {
        let fin = shared.final_seq[sender as usize].load(Ordering::Acquire);
        if fin > 0 && fin != u64::MAX && check.distinct >= fin {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            ev = conn.recv() => match ev {
                Event::Delivered(p) => {
                    let now = Instant::now();
                    match decode_payload(&p) {
                        Some((sent_us, seq, from)) if from == sender => {
                            check.take(seq);
                            if shared.clock.measured_us(sent_us) {
                                shared.latency.record(i, shared.clock.us(now).saturating_sub(sent_us));
                            }
                            if shared.clock.measured(now) {
                                shared.in_window.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => check.bad += 1,
                    }
                }
                Event::Acked(_) => {}
                Event::Closed(why) => {
                    eprintln!("im-bench peer: receiver {i} closed: {why}");
                    break;
                }
            },
            _ = tick.tick() => {
                if last_keepalive.elapsed() >= KEEPALIVE {
                    last_keepalive = Instant::now();
                    if conn.keepalive().await.is_err() {
                        break;
                    }
                }
                // A sender that stopped with nothing sent.
                if shared.final_seq[sender as usize].load(Ordering::Acquire) == u64::MAX {
                    break;
                }
            }
        }
    }
    conn.close().await;
    (sender, check)
}

/// What a sender counted.
#[derive(Debug, Default)]
pub(super) struct SenderTotals {
    pub(super) sent: u64,
    pub(super) sent_in_window: u64,
    pub(super) acked_in_window: u64,
    pub(super) unacked: u64,
}

/// Sends at `rate` to `dest` until the clock's end, then waits up to `drain` for acks.
/// `slot` places this sender's ticks within the period: `(idx, of)` starts it at
/// `period × idx / of`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn send_loop(
    mut conn: PeerConn,
    slot: (u32, u32),
    dest: Dest,
    rate: f64,
    size: usize,
    ack: bool,
    clock: Clock,
    drain: Duration,
    ack_latency: Arc<LatencyRecorder>,
    shared: Arc<Receivers>,
) -> SenderTotals {
    let mut t = SenderTotals::default();
    let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let (idx, of) = slot;
    let offset = period.mul_f64(f64::from(idx % of.max(1)) / f64::from(of.max(1)));
    let mut tick = tokio::time::interval_at(clock.base + offset, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut outstanding: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut last_keepalive = Instant::now();
    let drain_end = clock.end + drain;
    loop {
        let now = Instant::now();
        let sending = now < clock.end;
        if !sending && (outstanding.is_empty() || now >= drain_end) {
            break;
        }
        tokio::select! {
            biased;
            ev = conn.recv() => match ev {
                Event::Acked(k) => {
                    if let Some((sent_us, measured)) = outstanding.remove(&k) {
                        let now = Instant::now();
                        if measured {
                            ack_latency.record(idx as usize, clock.us(now).saturating_sub(sent_us));
                        }
                        if clock.measured(now) {
                            t.acked_in_window += 1;
                        }
                    }
                }
                Event::Delivered(_) => {}
                Event::Closed(why) => {
                    eprintln!("im-bench peer: sender {idx} closed: {why}");
                    break;
                }
            },
            _ = tick.tick(), if sending => {
                let now = Instant::now();
                let seq = t.sent + 1;
                let sent_us = clock.us(now);
                let p = encode_payload(sent_us, seq, idx, size);
                match conn.publish(&dest, p, ack).await {
                    Ok(key) => {
                        t.sent = seq;
                        let measured = clock.measured(now);
                        if measured {
                            t.sent_in_window += 1;
                        }
                        if ack || matches!(conn, PeerConn::Im { .. }) {
                            outstanding.insert(key, (sent_us, measured));
                        }
                    }
                    Err(e) => {
                        eprintln!("im-bench peer: sender {idx}: {e:#}");
                        break;
                    }
                }
                if last_keepalive.elapsed() >= KEEPALIVE && !ack {
                    last_keepalive = Instant::now();
                    let _ = conn.keepalive().await;
                }
            }
            _ = tokio::time::sleep_until(drain_end), if !sending => {}
        }
    }
    t.unacked = outstanding.len() as u64;
    let fin = if t.sent == 0 { u64::MAX } else { t.sent };
    shared.final_seq[idx as usize].store(fin, Ordering::Release);
    shared.senders_done.fetch_add(1, Ordering::Relaxed);
    conn.close().await;
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_time_seq_and_sender() {
        let p = encode_payload(123_456, 42, 7, 64);
        assert_eq!(p.len(), 64);
        assert_eq!(decode_payload(&p), Some((123_456, 42, 7)));
        assert_eq!(encode_payload(1, 2, 3, 0).len(), PAYLOAD_HEADER);
        assert_eq!(decode_payload(&p[..19]), None);
    }

    #[test]
    fn the_sequence_check_counts_losses_duplicates_and_reordering() {
        let mut c = SeqCheck::default();
        for seq in [1, 2, 4, 3, 4, 0, MAX_SEQ + 1] {
            c.take(seq);
        }
        assert_eq!((c.distinct, c.duplicates, c.reordered, c.bad), (4, 1, 1, 2));
        assert_eq!(c.lost(6), 2);
        let mut d = Delivery {
            losses_fail: false,
            ..Delivery::default()
        };
        let mut clean = SeqCheck::default();
        clean.take(1);
        d.add(&clean, 2);
        assert_eq!((d.expected, d.delivered, d.lost), (2, 1, 1));
        assert!(d.passed(), "losses are allowed for at-most-once");
        d.losses_fail = true;
        assert!(!d.passed());
        d.add(&c, 6);
        d.losses_fail = false;
        assert!(!d.passed(), "duplicates always fail");
    }
}
