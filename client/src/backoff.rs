//! Reconnect backoff and retry jitter (no RNG dependency: std's random hasher keys).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A random `u64` (not cryptographic): std's per-process random keys plus a counter.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A uniformly random duration in `[lo, hi]` (millisecond resolution below 1 s is fine).
pub(crate) fn between(lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let span = (hi - lo).as_micros() as u64;
    lo + Duration::from_micros(random_u64() % (span + 1))
}

/// Delay before resending after `Error OVERLOADED`: `retry_after_ms` (at least 1 ms)
/// plus up to 50% jitter, so a herd of clients does not retry in lockstep.
pub(crate) fn overload_delay(retry_after_ms: u32) -> Duration {
    let base = Duration::from_millis(u64::from(retry_after_ms.max(1)));
    between(base, base + base / 2)
}

/// Exponential backoff from `min` doubling up to `max`, with "equal jitter"
/// (each delay is uniformly in `[d/2, d]`).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A fresh backoff; `max` below `min` is raised to `min`.
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// The un-jittered delay of the current attempt.
    fn ceiling(&self) -> Duration {
        let factor = 1u32 << self.attempt.min(20);
        self.min.saturating_mul(factor).min(self.max)
    }

    /// The delay before the next attempt (grows each call).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        between(d / 2, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps_with_jitter() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let mut b = Backoff::new(min, max);
        let mut ceil = min;
        for _ in 0..40 {
            let d = b.next_delay();
            assert!(
                d >= ceil / 2 && d <= ceil,
                "{d:?} not in [{:?}, {ceil:?}]",
                ceil / 2
            );
            ceil = (ceil * 2).min(max);
        }
        assert_eq!(b.ceiling(), max);
    }

    #[test]
    fn backoff_jitter_varies() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
            seen.insert(b.next_delay());
        }
        assert!(seen.len() > 1);
    }

    #[test]
    fn overload_delay_is_at_least_the_hint() {
        for _ in 0..100 {
            let d = overload_delay(0);
            assert!(d >= Duration::from_millis(1) && d <= Duration::from_micros(1500));
            let d = overload_delay(200);
            assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(300));
        }
    }

    #[test]
    fn between_handles_empty_range() {
        let d = Duration::from_millis(3);
        assert_eq!(between(d, d), d);
        assert_eq!(between(d, Duration::ZERO), d);
    }
}
