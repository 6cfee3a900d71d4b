//! Flow: the per-connection outbound queue, bounded in bytes.
//!
//! Producers (the persistence writer for acks, the router for deliveries, the
//! connection's own reader for replies) call [`Outbound::push`]; the connection's write
//! loop drains it. Above the soft mark the connection is a slow consumer and only
//! critical frames are queued (the rest it fetches by sync); above the hard mark it is
//! closed. This module owns those decisions and the per-connection figures.

use std::collections::VecDeque;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;

use crate::obs::trace::TraceCopy;
use crate::obs::{EndToEnd, Metrics, Stage};

/// One queued frame: encoded bytes (shared across recipients), when it was queued, and
/// the end-to-end probe of the message it carries, if any.
pub struct OutFrame {
    /// The encoded frame.
    pub bytes: Bytes,
    /// When it entered the queue (for the `queue_wait` stage).
    pub enqueued: Instant,
    /// Completed when the last recipient's write is done.
    pub e2e: Option<std::sync::Arc<EndToEnd>>,
    /// The message's trace, for its recipient's queue_wait and write (None: untraced).
    pub trace: Option<Box<TraceCopy>>,
}

/// Why a connection is being closed: a WebSocket close code and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    /// WebSocket close code.
    pub code: u16,
    /// Short reason sent in the close frame (and the `reason` label of the metric).
    pub reason: &'static str,
}

impl CloseReason {
    /// Login missing, token invalid, or too many bad frames (1008).
    pub const POLICY: u16 = 1008;
    /// Text frames (1003).
    pub const UNSUPPORTED: u16 = 1003;
    /// Oversized frame (1009).
    pub const TOO_BIG: u16 = 1009;
    /// Server shutting down (1001).
    pub const GOING_AWAY: u16 = 1001;
    /// Idle timeout (private range).
    pub const IDLE: u16 = 4001;
    /// Kicked by an operator (private range).
    pub const KICKED: u16 = 4002;
    /// The session's token expired (or was revoked).
    pub const TOKEN_EXPIRED: u16 = 4003;
    /// Slow consumer: hard mark or write timeout (private range).
    pub const SLOW: u16 = 4008;

    /// Builds a reason.
    pub const fn new(code: u16, reason: &'static str) -> Self {
        CloseReason { code, reason }
    }
}

/// Outcome of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued for writing.
    Queued,
    /// Not queued: the connection is a slow consumer and the frame was not critical.
    DroppedSlow,
    /// Not queued: the connection is closing or closed.
    Closed,
}

/// Connection lifecycle state, as shown by the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Connected, not yet logged in.
    Handshake = 0,
    /// Logged in and healthy.
    Active = 1,
    /// Above the soft mark.
    Slow = 2,
    /// Being closed.
    Closing = 3,
}

/// The outbound side of one connection, shared by everyone who writes to it.
pub struct Outbound {
    /// Node-unique connection id.
    pub conn_id: u64,
    /// When the connection was accepted.
    pub opened: Instant,
    /// Remote address.
    pub remote: String,
    user: Mutex<Option<String>>,
    device: Mutex<Option<String>>,
    queue: std::sync::Arc<QueueShared>,
    queued: AtomicUsize,
    soft: usize,
    hard: usize,
    slow: AtomicBool,
    logged_in: AtomicBool,
    /// The pending notify-and-pull hint: 0 none, [`HINT_ALL`] one for every
    /// conversation, else the [`hint_key`] of the conversation it names.
    sync_hint: AtomicU64,
    /// Set once the connection starts closing (read without a lock on every push).
    closing: AtomicBool,
    /// Why it closes: the first reason given.
    close_reason: Mutex<Option<CloseReason>>,
    /// Wakes the read and write loops when the connection starts closing. A `Notify`
    /// rather than a `watch` channel, whose shared state (eight wait lists) would be the
    /// largest allocation of an idle connection's outbound side.
    closed: tokio::sync::Notify,
    /// Frames received from the client.
    pub frames_in: AtomicU64,
    /// Frames handed to the socket.
    pub frames_out: AtomicU64,
    metrics: Metrics,
}

/// The write loop's end of an [`Outbound`].
pub struct OutboundRx {
    /// Encoded frames to write, in order.
    pub frames: FrameQueue,
}

impl OutboundRx {
    /// Moves frames already queued into `batch`, without waiting, until it holds `max`.
    pub fn fill(&mut self, batch: &mut Vec<OutFrame>, max: usize) {
        self.frames.take_into(batch, max);
    }
}

/// The receiving end of a connection's outbound queue (see [`Outbound`]).
///
/// A mutex-guarded `VecDeque` and a `Notify` instead of tokio's unbounded channel, which
/// allocates a 32-slot block for every connection up front: this queue holds no frame
/// room until a frame is pushed, and gives its room back once a burst has drained, so an
/// idle connection's queue is a few dozen bytes (and the few slots its first frames took).
/// One consumer (the write loop), FIFO.
pub struct FrameQueue {
    shared: std::sync::Arc<QueueShared>,
}

/// The state both ends of a [`FrameQueue`] share.
struct QueueShared {
    state: Mutex<QueueState>,
    /// Wakes the consumer; signalled only when a push finds the queue empty.
    ready: tokio::sync::Notify,
}

struct QueueState {
    frames: VecDeque<OutFrame>,
    /// The sending side ([`Outbound`]) is gone: the queue ends once drained.
    sender_gone: bool,
    /// The consumer is gone: pushes fail.
    receiver_gone: bool,
}

/// [`FrameQueue::try_recv`] found nothing queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEmpty;

/// The pending-hint key of a hint for every conversation (after lost pushes).
pub const HINT_ALL: u64 = u64::MAX;

/// The pending-hint key of a hint naming `conversation_id`: never 0 nor [`HINT_ALL`].
pub fn hint_key(conversation_id: &str) -> u64 {
    // FNV-1a: stable, cheap, computed once per message, not per connection.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in conversation_id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h.clamp(1, HINT_ALL - 1)
}

/// Frames kept as spare room after a burst drains; above this the room is freed.
const SPARE_FRAMES: usize = 16;

impl QueueShared {
    fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(QueueShared {
            state: Mutex::new(QueueState {
                frames: VecDeque::new(),
                sender_gone: false,
                receiver_gone: false,
            }),
            ready: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding this lock leaves only a VecDeque behind: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item`; gives it back when the consumer is gone.
    fn push(&self, item: OutFrame) -> Result<(), OutFrame> {
        let was_empty = {
            let mut s = self.lock();
            if s.receiver_gone {
                return Err(item);
            }
            s.frames.push_back(item);
            s.frames.len() == 1
        };
        if was_empty {
            self.ready.notify_one();
        }
        Ok(())
    }

    fn close_sender(&self) {
        self.lock().sender_gone = true;
        self.ready.notify_one();
    }
}

impl QueueState {
    fn pop(&mut self) -> Option<OutFrame> {
        let f = self.frames.pop_front();
        // Drained: room above a few frames goes (a burst's); what is left is reused by
        // the next frames instead of growing from nothing each time.
        if self.frames.is_empty() && self.frames.capacity() > SPARE_FRAMES {
            self.frames = VecDeque::new();
        }
        f
    }
}

impl FrameQueue {
    /// The next frame, waiting for one; `None` once the sending side is gone and
    /// everything queued was taken. Cancel-safe: a frame is only taken by a poll that
    /// returns it.
    pub async fn recv(&mut self) -> Option<OutFrame> {
        loop {
            {
                let mut s = self.shared.lock();
                if let Some(f) = s.pop() {
                    return Some(f);
                }
                if s.sender_gone {
                    return None;
                }
            }
            // A push between the check and this wait leaves a permit: no lost wake-up.
            self.shared.ready.notified().await;
        }
    }

    /// The next frame if one is queued.
    pub fn try_recv(&mut self) -> Result<OutFrame, QueueEmpty> {
        self.shared.lock().pop().ok_or(QueueEmpty)
    }

    /// Moves queued frames into `batch` under one lock, until it holds `max`.
    fn take_into(&mut self, batch: &mut Vec<OutFrame>, max: usize) {
        let mut s = self.shared.lock();
        while batch.len() < max {
            match s.pop() {
                Some(f) => batch.push(f),
                None => break,
            }
        }
    }
}

impl Drop for FrameQueue {
    fn drop(&mut self) {
        // Nothing will write what is still queued: its memory goes now, not when the
        // last holder of the Outbound lets go.
        let left = {
            let mut s = self.shared.lock();
            s.receiver_gone = true;
            std::mem::take(&mut s.frames)
        };
        drop(left);
    }
}

/// What one socket write sends for `batch`: its one frame, or all of them coalesced into
/// one `Batch` frame ([`im_proto::encode_batch`]); records each frame's queue wait and
/// also returns the queued bytes the write will release.
pub fn coalesce(batch: &[OutFrame], metrics: &Metrics) -> (Bytes, usize) {
    let now = Instant::now();
    let mut len = 0;
    for f in batch {
        metrics.stage(Stage::QueueWait, now - f.enqueued);
        if let Some(t) = &f.trace {
            t.stage(Stage::QueueWait, f.enqueued, now);
        }
        len += f.bytes.len();
    }
    let bytes = if batch.len() == 1 {
        batch[0].bytes.clone()
    } else {
        im_proto::encode_batch(batch.iter().map(|f| f.bytes.as_ref()))
    };
    (bytes, len)
}

/// Records the socket write of `batch` (from `start` to `end`) in the traces its frames
/// carry: one check per frame when none is traced.
pub fn trace_written(batch: &[OutFrame], start: Instant, end: Instant) {
    for f in batch {
        if let Some(t) = &f.trace {
            t.stage(Stage::Write, start, end);
        }
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        // The queue ends for the write loop once what is queued was taken.
        self.queue.close_sender();
    }
}

impl Outbound {
    /// Creates the queue for a new connection.
    pub fn new(
        conn_id: u64,
        remote: String,
        soft: u64,
        hard: u64,
        metrics: Metrics,
    ) -> (std::sync::Arc<Outbound>, OutboundRx) {
        let queue = QueueShared::new();
        let out = Outbound {
            conn_id,
            opened: Instant::now(),
            remote,
            user: Mutex::new(None),
            device: Mutex::new(None),
            queue: queue.clone(),
            queued: AtomicUsize::new(0),
            soft: soft as usize,
            hard: hard as usize,
            slow: AtomicBool::new(false),
            logged_in: AtomicBool::new(false),
            sync_hint: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            close_reason: Mutex::new(None),
            closed: tokio::sync::Notify::new(),
            frames_in: AtomicU64::new(0),
            frames_out: AtomicU64::new(0),
            metrics,
        };
        (
            std::sync::Arc::new(out),
            OutboundRx {
                frames: FrameQueue { shared: queue },
            },
        )
    }

    /// Queues an encoded frame. Critical frames (acks, errors, pongs, one-to-one
    /// messages) pass the soft mark; nothing passes the hard mark, which closes the
    /// connection instead.
    pub fn push(&self, frame: Bytes, critical: bool) -> Pushed {
        self.push_traced(frame, critical, None)
    }

    /// As [`Outbound::push`], carrying the message's end-to-end probe to the write.
    pub fn push_traced(
        &self,
        frame: Bytes,
        critical: bool,
        e2e: Option<&std::sync::Arc<EndToEnd>>,
    ) -> Pushed {
        self.push_with_trace(frame, critical, e2e, None)
    }

    /// As [`Outbound::push_traced`], also carrying the message's trace (for its
    /// recipient's queue_wait and write stages).
    pub fn push_with_trace(
        &self,
        frame: Bytes,
        critical: bool,
        e2e: Option<&std::sync::Arc<EndToEnd>>,
        trace: Option<&TraceCopy>,
    ) -> Pushed {
        if self.closing.load(Acquire) {
            return Pushed::Closed;
        }
        let len = frame.len();
        let queued = self.queued.load(Relaxed);
        if queued + len > self.hard {
            self.metrics.slow_consumer_disconnects.increment(1);
            self.metrics.totals.slow_disconnects.fetch_add(1, Relaxed);
            self.close(CloseReason::new(CloseReason::SLOW, "slow consumer"));
            return Pushed::Closed;
        }
        if queued + len > self.soft {
            if !self.slow.swap(true, Relaxed) {
                self.metrics.slow_consumers.increment(1.0);
                self.metrics.totals.slow_marked.fetch_add(1, Relaxed);
            }
            if !critical {
                self.metrics.dropped_slow.increment(1);
                return Pushed::DroppedSlow;
            }
        }
        self.queued.fetch_add(len, Relaxed);
        self.metrics.outbound_queued_bytes.increment(len as f64);
        let item = OutFrame {
            bytes: frame,
            enqueued: Instant::now(),
            e2e: e2e.map(|e| {
                e.add();
                e.clone()
            }),
            trace: trace.map(|t| Box::new(t.clone())),
        };
        if let Err(item) = self.queue.push(item) {
            self.written(len);
            if let Some(e) = item.e2e {
                e.done(&self.metrics);
            }
            return Pushed::Closed;
        }
        Pushed::Queued
    }

    /// Queues a notify-and-pull hint unless one for the same conversation (`key`, from
    /// [`hint_key`]), or one for every conversation ([`HINT_ALL`]), is already pending:
    /// at most one per conversation between two syncs.
    pub fn hint_sync(&self, hint: &Bytes, key: u64) -> bool {
        let newer = self.sync_hint.fetch_update(Relaxed, Relaxed, |pending| {
            (pending != key && pending != HINT_ALL).then_some(key)
        });
        newer.is_ok() && self.push(hint.clone(), true) == Pushed::Queued
    }

    /// The client is syncing: the next committed message may hint again.
    pub fn clear_sync_hint(&self) {
        self.sync_hint.store(0, Relaxed);
    }

    /// Called by the write loop once `len` bytes have left the queue.
    pub fn written(&self, len: usize) {
        let before = self.queued.fetch_sub(len, Relaxed);
        self.metrics.outbound_queued_bytes.decrement(len as f64);
        if before - len < self.soft / 2 && self.slow.swap(false, Relaxed) {
            self.metrics.slow_consumers.decrement(1.0);
        }
    }

    /// Called by the write loop after writing `batch` (whose frames held `len` queued
    /// bytes): releases the bytes, counts the frames out, completes their probes.
    pub fn batch_written(&self, batch: &mut Vec<OutFrame>, len: usize) {
        self.written(len);
        self.frames_out.fetch_add(batch.len() as u64, Relaxed);
        for f in batch.drain(..) {
            if let Some(e) = f.e2e {
                e.done(&self.metrics);
            }
        }
    }

    /// Asks the connection to close (first reason wins).
    pub fn close(&self, reason: CloseReason) {
        {
            // A panic while holding this lock leaves an Option behind: still usable.
            let mut cur = self.close_reason.lock().unwrap_or_else(|e| e.into_inner());
            if cur.is_some() {
                return;
            }
            *cur = Some(reason);
            self.closing.store(true, Release);
        }
        self.closed.notify_waiters();
    }

    /// Resolves once the connection is closing (at once if it is already).
    pub async fn closed(&self) {
        // A `Notified` receives every `notify_waiters` made after it was created, polled
        // or not, so a close between the check and the wait still wakes it.
        let notified = self.closed.notified();
        if self.closing.load(Acquire) {
            return;
        }
        notified.await;
    }

    /// The close reason, once closing.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.close_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the logged-in user.
    pub fn set_user(&self, user: &str) {
        if let Ok(mut u) = self.user.lock() {
            *u = Some(user.to_owned());
        }
        self.logged_in.store(true, Relaxed);
    }

    /// The logged-in user, if any.
    pub fn user(&self) -> Option<String> {
        self.user.lock().ok().and_then(|u| u.clone())
    }

    /// Records the logged-in device (`Login.device_id`, `default` when empty).
    pub fn set_device(&self, device: &str) {
        if let Ok(mut d) = self.device.lock() {
            *d = Some(if device.is_empty() { "default" } else { device }.to_owned());
        }
    }

    /// The logged-in device, if any.
    pub fn device(&self) -> Option<String> {
        self.device.lock().ok().and_then(|d| d.clone())
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// Whether the queue is above its low mark (half the soft mark, where a slow
    /// consumer recovers) or the connection is marked slow: ephemeral frames (typing)
    /// skip it.
    pub fn above_low_mark(&self) -> bool {
        self.slow.load(Relaxed) || self.queued.load(Relaxed) > self.soft / 2
    }

    /// Current state.
    pub fn state(&self) -> ConnState {
        if self.closing.load(Acquire) {
            ConnState::Closing
        } else if self.slow.load(Relaxed) {
            ConnState::Slow
        } else if self.logged_in.load(Relaxed) {
            ConnState::Active
        } else {
            ConnState::Handshake
        }
    }

    /// Releases gauges this connection holds (called once when it ends).
    pub fn finish(&self) {
        if self.slow.swap(false, Relaxed) {
            self.metrics.slow_consumers.decrement(1.0);
        }
        let left = self.queued.swap(0, Relaxed);
        self.metrics.outbound_queued_bytes.decrement(left as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> (std::sync::Arc<Outbound>, OutboundRx) {
        Outbound::new(1, "test".into(), 1 << 20, 2 << 20, Metrics::new(false))
    }

    fn frame(i: u8) -> Bytes {
        Bytes::from(vec![i; 8])
    }

    #[tokio::test]
    async fn queue_is_fifo_and_wakes_a_waiting_write_loop() {
        let (out, mut rx) = conn();
        let waiting = tokio::spawn(async move {
            let first = rx.frames.recv().await.map(|f| f.bytes);
            let mut batch = Vec::new();
            while batch.len() < 2 {
                tokio::task::yield_now().await;
                rx.fill(&mut batch, 64);
            }
            (
                first,
                batch.into_iter().map(|f| f.bytes).collect::<Vec<_>>(),
            )
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        for i in 0..3 {
            assert_eq!(out.push(frame(i), true), Pushed::Queued);
        }
        let (first, rest) = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the write loop was woken")
            .expect("no panic");
        assert_eq!(first, Some(frame(0)));
        assert_eq!(rest, vec![frame(1), frame(2)]);
    }

    #[tokio::test]
    async fn queue_ends_when_the_sender_is_gone_and_refuses_when_the_receiver_is() {
        let (out, mut rx) = conn();
        out.push(frame(7), true);
        drop(out);
        assert_eq!(rx.frames.recv().await.map(|f| f.bytes), Some(frame(7)));
        assert!(rx.frames.recv().await.is_none());

        let (out, rx) = conn();
        out.push(frame(2), true);
        let shared = rx.frames.shared.clone();
        drop(rx);
        assert!(shared.lock().frames.is_empty(), "what was queued is freed");
        assert_eq!(out.push(frame(1), true), Pushed::Closed);
        // The frame taken before the close stays counted until `finish`; the refused
        // one is not counted at all.
        assert_eq!(out.queued_bytes(), 8);
    }

    #[test]
    fn queue_gives_back_its_room_after_a_burst() {
        let (out, mut rx) = conn();
        assert_eq!(rx.frames.shared.lock().frames.capacity(), 0);
        for i in 0..200 {
            out.push(frame(i as u8), true);
        }
        assert!(rx.frames.shared.lock().frames.capacity() >= 200);
        let mut batch = Vec::new();
        rx.fill(&mut batch, 1000);
        assert_eq!(batch.len(), 200);
        assert_eq!(rx.frames.try_recv().map(|f| f.bytes), Err(QueueEmpty));
        assert_eq!(rx.frames.shared.lock().frames.capacity(), 0);
    }
}
