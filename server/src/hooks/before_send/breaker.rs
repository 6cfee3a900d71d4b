//! The circuit breaker in front of a hook: pure state over an injected clock. Closed, it
//! counts failed calls in a sliding window and opens after `failures` of them; open, it
//! lets no call through until the cool-down has passed; then half-open, it lets exactly
//! one probe call through, whose success closes it and whose failure opens it again.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The breaker's state, as the metric gauge and the overview show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go through.
    Closed,
    /// One probe call is (or may be) in flight; others are not let through.
    HalfOpen,
    /// No call goes through until the cool-down ends.
    Open,
}

impl State {
    /// The label and overview word.
    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::HalfOpen => "half_open",
            State::Open => "open",
        }
    }

    /// The value of `im_hook_breaker_state` (0 closed, 1 half-open, 2 open).
    pub fn gauge(self) -> f64 {
        match self {
            State::Closed => 0.0,
            State::HalfOpen => 1.0,
            State::Open => 2.0,
        }
    }
}

/// Whether a call may go out now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call, closed breaker.
    Call,
    /// Call: this is the half-open probe.
    Probe,
    /// Do not call.
    Refused,
}

/// What a recorded outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// The breaker opened (from closed or after a failed probe).
    Opened,
    /// The breaker closed after a successful probe.
    Closed,
}

/// The breaker.
#[derive(Debug)]
pub struct Breaker {
    failures: u32,
    window: Duration,
    cooldown: Duration,
    state: State,
    /// Closed: times of the failures within the window (at most `failures`).
    recent: VecDeque<Instant>,
    /// Open: when the cool-down ends.
    open_until: Option<Instant>,
    /// Half-open: whether the probe is out.
    probing: bool,
}

impl Breaker {
    /// A closed breaker opening after `failures` failures within `window`, open for `cooldown`.
    pub fn new(failures: u32, window: Duration, cooldown: Duration) -> Self {
        Breaker {
            failures: failures.max(1),
            window,
            cooldown,
            state: State::Closed,
            recent: VecDeque::new(),
            open_until: None,
            probing: false,
        }
    }

    /// The state at `now` (an open breaker past its cool-down reads half-open).
    pub fn state(&self, now: Instant) -> State {
        match (self.state, self.open_until) {
            (State::Open, Some(until)) if now >= until => State::HalfOpen,
            (s, _) => s,
        }
    }

    /// Asks to call at `now`.
    pub fn permit(&mut self, now: Instant) -> Permit {
        if self.state(now) == State::HalfOpen {
            self.state = State::HalfOpen;
            self.open_until = None;
            if self.probing {
                return Permit::Refused;
            }
            self.probing = true;
            return Permit::Probe;
        }
        match self.state {
            State::Closed => Permit::Call,
            _ => Permit::Refused,
        }
    }

    /// Records a call's outcome at `now` (`probe`: it was the half-open probe).
    pub fn record(&mut self, now: Instant, ok: bool, probe: bool) -> Change {
        if probe {
            self.probing = false;
            return if ok { self.close() } else { self.open(now) };
        }
        if self.state != State::Closed || ok {
            // A late answer of a call made before the breaker opened changes nothing.
            return Change::None;
        }
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > self.window)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        if self.recent.len() >= self.failures as usize {
            self.open(now)
        } else {
            Change::None
        }
    }

    fn open(&mut self, now: Instant) -> Change {
        self.state = State::Open;
        self.open_until = Some(now + self.cooldown);
        self.recent.clear();
        Change::Opened
    }

    fn close(&mut self) -> Change {
        self.state = State::Closed;
        self.open_until = None;
        self.recent.clear();
        Change::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn opens_after_n_failures_in_the_window_only() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, ms(1000), ms(500));
        assert_eq!(b.permit(t0), Permit::Call);
        assert_eq!(b.record(t0, false, false), Change::None);
        assert_eq!(b.record(t0 + ms(100), false, false), Change::None);
        // The first failure has left the window: two in it, still closed.
        assert_eq!(b.record(t0 + ms(1050), false, false), Change::None);
        assert_eq!(b.state(t0 + ms(1050)), State::Closed);
        assert_eq!(b.record(t0 + ms(1080), false, false), Change::Opened);
        assert_eq!(b.state(t0 + ms(1080)), State::Open);
        assert_eq!(b.permit(t0 + ms(1400)), Permit::Refused);
    }

    #[test]
    fn half_open_lets_one_probe_through_and_it_decides() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, ms(1000), ms(500));
        assert_eq!(b.record(t0, false, false), Change::Opened);
        assert_eq!(b.permit(t0 + ms(499)), Permit::Refused);
        assert_eq!(b.state(t0 + ms(500)), State::HalfOpen);
        assert_eq!(b.permit(t0 + ms(500)), Permit::Probe);
        assert_eq!(b.permit(t0 + ms(501)), Permit::Refused);
        // A failed probe opens it for another cool-down.
        assert_eq!(b.record(t0 + ms(600), false, true), Change::Opened);
        assert_eq!(b.permit(t0 + ms(1000)), Permit::Refused);
        assert_eq!(b.permit(t0 + ms(1100)), Permit::Probe);
        assert_eq!(b.record(t0 + ms(1150), true, true), Change::Closed);
        assert_eq!(b.state(t0 + ms(1150)), State::Closed);
        assert_eq!(b.permit(t0 + ms(1150)), Permit::Call);
    }

    #[test]
    fn successes_and_late_answers_do_not_open_it() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, ms(1000), ms(500));
        assert_eq!(b.record(t0, true, false), Change::None);
        assert_eq!(b.record(t0, false, false), Change::None);
        assert_eq!(b.record(t0, false, false), Change::Opened);
        // Calls that were already out when it opened answer late: no change.
        assert_eq!(b.record(t0 + ms(10), false, false), Change::None);
        assert_eq!(b.record(t0 + ms(10), true, false), Change::None);
        assert_eq!(b.state(t0 + ms(10)), State::Open);
    }
}
