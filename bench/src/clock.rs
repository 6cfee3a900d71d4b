//! A run's timeline ([`Clock`]): time zero of payload timestamps, the warmup, the
//! measured window and the drain after it. Every scenario and the report read it.

use std::time::Duration;

use tokio::time::Instant;

/// A run's timeline: time zero of payload timestamps, the end of the warmup and the end
/// of the measured window.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Time zero (payload timestamps count microseconds from here).
    pub base: Instant,
    /// Measuring starts here.
    pub warmup_end: Instant,
    /// Measuring (and sending) stops here.
    pub end: Instant,
}

impl Clock {
    /// A timeline starting now: `warmup`, then `duration` measured.
    pub fn start(warmup: Duration, duration: Duration) -> Clock {
        let base = Instant::now();
        Clock {
            base,
            warmup_end: base + warmup,
            end: base + warmup + duration,
        }
    }

    /// Microseconds from the base to `t`.
    pub fn us(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_micros() as u64
    }

    /// Microseconds from the base to now.
    pub fn now_us(&self) -> u64 {
        self.us(Instant::now())
    }

    /// Whether `t` is in the measured window.
    pub fn measured(&self, t: Instant) -> bool {
        t >= self.warmup_end && t < self.end
    }

    /// Whether a payload timestamp (µs from the base) is in the measured window.
    pub fn measured_us(&self, us: u64) -> bool {
        (self.us(self.warmup_end)..self.us(self.end)).contains(&us)
    }

    /// `warmup`, `measure` or `drain`, for the progress line.
    pub fn phase(&self, now: Instant) -> &'static str {
        if now < self.warmup_end {
            "warmup"
        } else if now < self.end {
            "measure"
        } else {
            "drain"
        }
    }

    /// Measured seconds.
    pub fn measured_secs(&self) -> f64 {
        (self.end - self.warmup_end).as_secs_f64()
    }

    /// `n` per measured second (0 for an empty window).
    pub fn per_sec(&self, n: u64) -> f64 {
        let secs = self.measured_secs();
        if secs > 0.0 {
            n as f64 / secs
        } else {
            0.0
        }
    }
}
