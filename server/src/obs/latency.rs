//! In-process latency histograms: one lock-free array of log-linear buckets per stage
//! (4 sub-buckets per power of two of nanoseconds, so a percentile is within ~19%).
//! They feed the admin overview's p50/p99/p999 over a recent window; Prometheus gets the
//! same samples through the `metrics` histograms.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Buckets per histogram: below 1 us, then 4 per octave up to ~2^41 ns (~37 min).
pub const BUCKETS: usize = 128;

/// One histogram of durations.
pub struct LatencyHist {
    counts: [AtomicU64; BUCKETS],
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Bucket index of a duration in nanoseconds.
#[inline]
pub fn index(ns: u64) -> usize {
    if ns < 1024 {
        return (ns >> 8) as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize; // >= 10
    let sub = ((ns >> (exp - 2)) & 3) as usize;
    ((exp - 9) * 4 + sub).min(BUCKETS - 1)
}

/// Upper bound (ns, exclusive) of bucket `i`.
pub fn upper_bound_ns(i: usize) -> u64 {
    if i < 4 {
        return (i as u64 + 1) << 8;
    }
    let exp = i / 4 + 9;
    let sub = (i % 4) as u64;
    (4 + sub + 1) << (exp - 2)
}

impl LatencyHist {
    /// Records one duration.
    #[inline]
    pub fn record_ns(&self, ns: u64) {
        self.counts[index(ns)].fetch_add(1, Relaxed);
    }

    /// A copy of the cumulative counts.
    pub fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.counts[i].load(Relaxed)))
    }
}

/// Cumulative bucket counts at one moment.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Counts(pub [u64; BUCKETS]);

impl Default for Counts {
    fn default() -> Self {
        Counts([0; BUCKETS])
    }
}

impl Counts {
    /// Counts recorded since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.0[i].saturating_sub(earlier.0[i])
        }))
    }

    /// Number of samples.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The `q` quantile (0..=1) in microseconds (bucket upper bound); 0 with no samples.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in self.0.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper_bound_ns(i) as f64 / 1000.0;
            }
        }
        upper_bound_ns(BUCKETS - 1) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut prev = 0;
        for ns in [
            0u64,
            255,
            256,
            1023,
            1024,
            1500,
            2047,
            2048,
            10_000,
            1_000_000,
            5_000_000_000,
        ] {
            let i = index(ns);
            assert!(i >= prev, "{ns}");
            assert!(ns < upper_bound_ns(i), "{ns} !< {}", upper_bound_ns(i));
            if i > 0 {
                assert!(ns >= upper_bound_ns(i - 1), "{ns} below bucket {i}");
            }
            prev = i;
        }
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = LatencyHist::default();
        for us in 1..=1000u64 {
            h.record_ns(us * 1000);
        }
        let c = h.snapshot();
        let p50 = c.quantile_us(0.5);
        let p99 = c.quantile_us(0.99);
        assert!((500.0..=650.0).contains(&p50), "{p50}");
        assert!((990.0..=1250.0).contains(&p99), "{p99}");
        assert_eq!(c.since(&c).total(), 0);
    }
}
