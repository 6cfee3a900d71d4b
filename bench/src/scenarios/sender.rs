//! The sending loop shared by the scenarios whose connections send on a schedule
//! (`chat`, `broadcast`, `chaos`): keep up to a window of sends in flight, at a rate if
//! a [`Pacer`] is given, retry what the server asks to retry, time out what it never
//! answers, heartbeat when nothing else was written, stop sending at the end of the
//! measured window and drain the acks. What each frame means to the scenario (latency,
//! the checker's seqs, counters) is left to its [`Hooks`].
//!
//! [`SendCounts`] are the counters every such sender keeps; the hooks' default methods
//! count in them and in the run's errors and disconnects ([`RunCounts`]).
//!
//! The loop also returns early when its connection ends or, for disconnect injection,
//! when the `kill` notification fires; the caller reconnects and calls it again with the
//! same [`Outbox`] (after [`Outbox::resend_all`]).

use std::time::Duration;

use im_client::{ClientError, RawConn, RawEvent};
use im_proto::{Body, Frame, MessageType, SendAck};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::outbox::{Outbox, Pacer, Pending, Refused, SendSpec};
use crate::run::Disconnects;
use crate::stats::{ErrorCounts, LatencyRecorder, LocalError};
use crate::target::Session;

counters! {
    /// What every sender of the loop counts (`chat`, `broadcast`, `chaos`).
    pub struct SendCounts => SendTotals {
        /// Send frames written, retries (and resends after a reconnect) included.
        sent,
        /// OVERLOADED / RATE_LIMITED retries.
        retries,
        /// Acks received at any time (progress line).
        acked_all,
        /// Acks received in the measured window (throughput).
        acked_measured,
        /// SendAcks with duplicate=true.
        duplicate_acks,
        /// Acks that came after their send was given up on.
        late_acks,
        /// Sends still un-acked when the drain ended.
        unacked_at_end,
        /// Scheduled sends dropped because a sender was more than a second behind its rate.
        rate_skipped,
    }
}

impl SendCounts {
    /// [`Hooks::written`]: a frame was written (`retry`: a resend the server asked for).
    pub fn written(&self, retry: bool) {
        self.sent.inc();
        if retry {
            self.retries.inc();
        }
    }

    /// A SendAck arrived at `now` (counted in the window when `now` is measured).
    pub fn acked(&self, clock: &Clock, now: Instant, duplicate: bool) {
        self.acked_all.inc();
        if clock.measured(now) {
            self.acked_measured.inc();
        }
        if duplicate {
            self.duplicate_acks.inc();
        }
    }

    /// A sender stopped: what its pacer skipped and its outbox still holds.
    pub fn sender_done(&self, pacer: Option<&Pacer>, outbox: &Outbox) {
        if let Some(p) = pacer {
            self.rate_skipped.add(p.skipped());
        }
        self.unacked_at_end.add(outbox.len() as u64);
    }
}

/// How often the loop checks ack timeouts and heartbeats.
const HOUSEKEEPING: Duration = Duration::from_millis(250);

/// The run-wide counters a sender's default hooks count in.
#[derive(Debug, Clone, Copy)]
pub struct RunCounts<'a> {
    /// The senders' counters.
    pub send: &'a SendCounts,
    /// Errors by code.
    pub errors: &'a ErrorCounts,
    /// Connections that ended, by reason.
    pub disconnects: &'a Disconnects,
}

/// `fn counts(&self) -> RunCounts` for a scenario context with `send`, `errors` and
/// `disconnects` fields.
macro_rules! run_counts {
    ($ctx:ty) => {
        impl $ctx {
            fn counts(&self) -> $crate::scenarios::sender::RunCounts<'_> {
                $crate::scenarios::sender::RunCounts {
                    send: &self.send,
                    errors: &self.faults.errors,
                    disconnects: &self.faults.disconnects,
                }
            }
        }
    };
}
pub(crate) use run_counts;

/// What the scenario does with the loop's events. All calls are synchronous. The
/// defaults count in [`Hooks::counts`].
pub trait Hooks {
    /// The run's counters.
    fn counts(&self) -> RunCounts<'_>;
    /// The next message to send, or `None` to send nothing now.
    fn next(&mut self) -> Option<SendSpec>;
    /// A frame was written (`retry`: a resend after OVERLOADED / RATE_LIMITED).
    fn written(&mut self, retry: bool) {
        self.counts().send.written(retry);
    }
    /// After a new send is written: another frame to write right after it (the chaos
    /// scenario's malformed frames). None by default.
    fn after_send(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// A SendAck arrived; `pending` is its send (`None`: it had been given up on).
    fn acked(&mut self, ack: &SendAck, pending: Option<Pending>, now: Instant);
    /// An Error arrived, and what it did to its send.
    fn refused(&mut self, e: &im_proto::Error, _outcome: Refused) {
        self.counts().errors.server(e.code);
    }
    /// A send got neither an ack nor an error within the ack timeout.
    fn timed_out(&mut self, _p: Pending) {
        self.counts().errors.local(LocalError::AckTimeout);
    }
    /// Any other frame (Pong, Deliver, BAD_FRAME for injected frames, ...). Returns
    /// frames to write in reply, if any.
    fn other(&mut self, f: Frame, _now: Instant) -> Vec<Vec<u8>> {
        self.counts().errors.stray(&f);
        Vec::new()
    }
    /// Writing failed (the connection is gone).
    fn write_failed(&mut self, _e: &ClientError) {
        self.counts().errors.local(LocalError::Transport);
    }
    /// The connection ended (`ev` is the close event or the receive error).
    fn ended(&mut self, ev: Result<RawEvent, ClientError>) {
        let c = self.counts();
        c.disconnects.record(c.errors, ev);
    }
}

/// The hooks of a sender whose every message goes to one target (`chat`,
/// `broadcast`): counts, the send-to-ack latency of measured sends, and the acked seqs
/// for the checker.
pub struct ToOne<'a> {
    counts: RunCounts<'a>,
    clock: Clock,
    latency: &'a LatencyRecorder,
    shard: usize,
    spec: SendSpec,
    system_pushes: bool,
    /// Seqs acked (duplicates left out), in ack order.
    pub acked: Vec<u64>,
    /// The highest seq acked.
    pub max_acked: u64,
}

impl<'a> ToOne<'a> {
    /// Hooks that send `spec` again and again, recording send-to-ack latency in shard
    /// `shard` of `latency`.
    pub fn new(
        counts: RunCounts<'a>,
        clock: Clock,
        latency: &'a LatencyRecorder,
        shard: usize,
        spec: SendSpec,
    ) -> Self {
        ToOne {
            counts,
            clock,
            latency,
            shard,
            spec,
            system_pushes: false,
            acked: Vec::with_capacity(1024),
            max_acked: 0,
        }
    }

    /// Pushed SYSTEM messages (a group's membership events, pushed to its creator) are
    /// expected, not counted as unexpected frames.
    pub fn with_system_pushes(mut self) -> Self {
        self.system_pushes = true;
        self
    }
}

impl Hooks for ToOne<'_> {
    fn counts(&self) -> RunCounts<'_> {
        self.counts
    }

    fn next(&mut self) -> Option<SendSpec> {
        Some(self.spec.clone())
    }

    fn acked(&mut self, ack: &SendAck, pending: Option<Pending>, now: Instant) {
        self.counts.send.acked(&self.clock, now, ack.duplicate);
        if !ack.duplicate {
            self.acked.push(ack.seq);
        }
        self.max_acked = self.max_acked.max(ack.seq);
        match pending {
            Some(p) if self.clock.measured(p.first_sent) => {
                let us = now.saturating_duration_since(p.first_sent).as_micros() as u64;
                self.latency.record(self.shard, us);
            }
            Some(_) => {}
            None => self.counts.send.late_acks.inc(),
        }
    }

    fn other(&mut self, f: Frame, _now: Instant) -> Vec<Vec<u8>> {
        match &f.body {
            Some(Body::Deliver(d))
                if self.system_pushes
                    && d.messages
                        .iter()
                        .all(|m| m.r#type == MessageType::System as i32) => {}
            _ => self.counts.errors.stray(&f),
        }
        Vec::new()
    }
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The run is over and the outbox drained (or the drain ran out).
    Finished,
    /// The connection ended or a write failed.
    Disconnected,
    /// The kill notification fired.
    Killed,
}

/// The loop's settings.
pub struct Loop<'a> {
    /// The run's timeline: sending stops at `clock.end`, draining at `end + drain`.
    pub clock: Clock,
    /// Most un-acked sends.
    pub window: usize,
    /// The send rate (`None`: as fast as the window allows).
    pub pacer: Option<&'a mut Pacer>,
    /// How long to wait for acks after the end.
    pub drain: Duration,
    /// Protocol Ping after this long without writing.
    pub heartbeat: Duration,
    /// Disconnect injection: return [`Ended::Killed`] when notified.
    pub kill: Option<&'a Notify>,
}

impl<'a> Loop<'a> {
    /// A loop over `clock` keeping up to `window` sends in flight (paced by `pacer`, if
    /// any), draining for `drain`, with no disconnect injection.
    pub fn new(
        clock: Clock,
        window: usize,
        pacer: Option<&'a mut Pacer>,
        drain: Duration,
        heartbeat: Duration,
    ) -> Self {
        Loop {
            clock,
            window,
            pacer,
            drain,
            heartbeat,
            kill: None,
        }
    }
}

/// A sender whose every message goes to one target (`chat`, `broadcast`): runs the loop
/// over `session` with `hooks` (paced by `pacer`, if any) until the run is over and the
/// acks are drained, then counts what the pacer skipped and what stayed un-acked.
/// Returns the connection, for the caller to tell its end before closing it.
pub async fn run_to_one(
    session: Session,
    mut outbox: Outbox,
    mut pacer: Option<Pacer>,
    window: usize,
    drain: Duration,
    hooks: &mut ToOne<'_>,
) -> RawConn {
    let Session {
        mut conn,
        heartbeat,
    } = session;
    let cfg = Loop::new(hooks.clock, window, pacer.as_mut(), drain, heartbeat);
    run(&mut conn, &mut outbox, cfg, hooks).await;
    hooks.counts.send.sender_done(pacer.as_ref(), &outbox);
    conn
}

/// Runs the sending loop on `conn` until the run is over, the connection ends, or a
/// kill.
pub async fn run(
    conn: &mut RawConn,
    outbox: &mut Outbox,
    mut cfg: Loop<'_>,
    hooks: &mut impl Hooks,
) -> Ended {
    let clock = cfg.clock;
    let drain_deadline = clock.end + cfg.drain;
    let mut last_tx = Instant::now();
    let mut next_housekeeping = last_tx + HOUSEKEEPING;
    let sleep = tokio::time::sleep_until(next_housekeeping);
    tokio::pin!(sleep);
    let mut wake = Some(next_housekeeping);
    let never = Notify::new();
    let kill = cfg.kill.unwrap_or(&never);

    loop {
        let now = Instant::now();
        let sending = now < clock.end;
        if !sending && (outbox.is_empty() || now >= drain_deadline) {
            return Ended::Finished;
        }
        for frame in outbox.due_retries(now) {
            if let Err(e) = conn.send_bytes(frame).await {
                hooks.write_failed(&e);
                return Ended::Disconnected;
            }
            hooks.written(true);
            last_tx = now;
        }
        while sending
            && outbox.len() < cfg.window
            && cfg.pacer.as_mut().is_none_or(|p| p.take(Instant::now()))
        {
            let Some(spec) = hooks.next() else { break };
            let t = Instant::now();
            let frame = outbox.start(spec, t, clock.us(t));
            if let Err(e) = conn.send_bytes(frame).await {
                hooks.write_failed(&e);
                return Ended::Disconnected;
            }
            hooks.written(false);
            last_tx = t;
            if let Some(extra) = hooks.after_send() {
                if let Err(e) = conn.send_bytes(extra).await {
                    hooks.write_failed(&e);
                    return Ended::Disconnected;
                }
            }
        }

        let mut want = next_housekeeping.min(if sending { clock.end } else { drain_deadline });
        if let Some(at) = outbox.next_retry() {
            want = want.min(at);
        }
        if let Some(p) = &cfg.pacer {
            if sending && outbox.len() < cfg.window {
                want = want.min(p.next_at());
            }
        }
        if wake != Some(want) {
            sleep.as_mut().reset(want);
            wake = Some(want);
        }

        tokio::select! {
            biased;
            () = kill.notified() => return Ended::Killed,
            ev = conn.recv() => {
                let f = match ev {
                    Ok(RawEvent::Frame(f)) => f,
                    Ok(RawEvent::WsPong(_)) => continue,
                    other => {
                        hooks.ended(other);
                        return Ended::Disconnected;
                    }
                };
                let now = Instant::now();
                match f.body {
                    Some(Body::SendAck(ack)) => {
                        let p = outbox.take(f.req_id);
                        hooks.acked(&ack, p, now);
                    }
                    Some(Body::Error(e)) if f.req_id != 0 && outbox.pending().iter().any(|p| p.n == f.req_id) => {
                        let outcome = outbox.refused(f.req_id, &e, now);
                        hooks.refused(&e, outcome);
                    }
                    body => {
                        for frame in hooks.other(Frame { req_id: f.req_id, body }, now) {
                            if let Err(e) = conn.send_bytes(frame).await {
                                hooks.write_failed(&e);
                                return Ended::Disconnected;
                            }
                            last_tx = now;
                        }
                    }
                }
            }
            () = &mut sleep => {
                // The sleep is spent: force a reset on the next turn.
                wake = None;
                let now = Instant::now();
                if now >= next_housekeeping {
                    next_housekeeping = now + HOUSEKEEPING;
                    for p in outbox.expired(now) {
                        hooks.timed_out(p);
                    }
                    if now.saturating_duration_since(last_tx) >= cfg.heartbeat / 2 {
                        if let Err(e) = crate::run::ping(conn).await {
                            hooks.write_failed(&e);
                            return Ended::Disconnected;
                        }
                        last_tx = now;
                    }
                }
            }
        }
    }
}
