//! In-process latency histograms: one lock-free array of log-linear buckets per stage
//! (4 sub-buckets per power of two of nanoseconds, so a percentile is within ~19%).
//! They feed the admin overview's p50/p99/p999 over a recent window, and they are what
//! `/metrics` exports as `im_stage_duration_seconds` (the Prometheus buckets below): a
//! probe records once, here, and the scrape adds the fine buckets up. A fine bucket that
//! a Prometheus bound falls inside is split in two at that bound, so the exported counts
//! are exact, and a sample is still one relaxed add (plus one for the sum).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Buckets per histogram: below 1 us, then 4 per octave up to ~2^41 ns (~37 min).
pub const BUCKETS: usize = 128;

/// The `le` bounds (seconds) of the exported Prometheus histogram: 1 us to 10 s.
pub const PROM_BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// [`PROM_BUCKETS`] in nanoseconds (rounded: `2.5e-6 * 1e9` is not exactly 2,500).
const PROM_BOUNDS_NS: [u64; 22] = {
    let mut ns = [0u64; 22];
    let mut j = 0;
    while j < ns.len() {
        ns[j] = (PROM_BUCKETS[j] * 1e9 + 0.5) as u64;
        j += 1;
    }
    ns
};

/// Per fine bucket, the Prometheus bound strictly inside it (0: none). Samples above it
/// go to the bucket's upper half, slot `BUCKETS + i`.
const SPLIT: [u64; BUCKETS] = {
    let mut split = [0u64; BUCKETS];
    let mut i = 0;
    while i < BUCKETS {
        let lower = if i == 0 { 0 } else { upper_bound_ns(i - 1) };
        let upper = upper_bound_ns(i);
        let mut j = 0;
        while j < PROM_BOUNDS_NS.len() {
            let b = PROM_BOUNDS_NS[j];
            if lower <= b && b + 1 < upper {
                split[i] = b;
            }
            j += 1;
        }
        i += 1;
    }
    split
};

/// One histogram of durations.
pub struct LatencyHist {
    /// Fine buckets `0..BUCKETS`, then the upper halves of the split ones.
    counts: [AtomicU64; 2 * BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
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
pub const fn upper_bound_ns(i: usize) -> u64 {
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
        let i = index(ns);
        let split = SPLIT[i];
        let slot = if split != 0 && ns > split {
            BUCKETS + i
        } else {
            i
        };
        self.counts[slot].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// A copy of the cumulative counts (split buckets whole again).
    pub fn snapshot(&self) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.counts[i].load(Relaxed) + self.counts[BUCKETS + i].load(Relaxed)
        }))
    }

    /// The cumulative counts at each of [`PROM_BUCKETS`], the total and the sum: what a
    /// Prometheus histogram exports.
    pub fn prometheus(&self) -> PromCounts {
        let lower: [u64; BUCKETS] = std::array::from_fn(|i| self.counts[i].load(Relaxed));
        let upper: [u64; BUCKETS] = std::array::from_fn(|i| self.counts[BUCKETS + i].load(Relaxed));
        let le = PROM_BOUNDS_NS.map(|b| {
            (0..BUCKETS)
                .map(|i| {
                    if upper_bound_ns(i) <= b + 1 {
                        lower[i] + upper[i]
                    } else if SPLIT[i] == b {
                        lower[i]
                    } else {
                        0
                    }
                })
                .sum()
        });
        PromCounts {
            le,
            count: lower.iter().chain(upper.iter()).sum(),
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// One histogram as Prometheus exports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromCounts {
    /// Samples at or below each of [`PROM_BUCKETS`] (cumulative).
    pub le: [u64; 22],
    /// Every sample (`le="+Inf"`, `_count`).
    pub count: u64,
    /// Sum of the samples in nanoseconds (`_sum`, in seconds once divided).
    pub sum_ns: u64,
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

    #[test]
    fn prometheus_buckets_are_exact_at_their_bounds() {
        let h = LatencyHist::default();
        // Either side of every bound, and far out.
        assert_eq!(PROM_BOUNDS_NS[1], 2_500);
        assert_eq!(PROM_BOUNDS_NS[21], 10_000_000_000);
        let mut samples = vec![0u64, 20_000_000_000];
        for b in PROM_BOUNDS_NS {
            samples.extend([b - 1, b, b + 1, b + b / 10]);
        }
        for ns in &samples {
            h.record_ns(*ns);
        }
        let p = h.prometheus();
        for (j, b) in PROM_BOUNDS_NS.iter().enumerate() {
            let want = samples.iter().filter(|ns| **ns <= *b).count() as u64;
            assert_eq!(p.le[j], want, "le {b} ns");
        }
        assert_eq!(p.count, samples.len() as u64);
        assert_eq!(p.sum_ns, samples.iter().sum::<u64>());
        assert_eq!(h.snapshot().total(), samples.len() as u64);
        // The percentiles still see whole fine buckets.
        let same = samples
            .iter()
            .filter(|ns| index(**ns) == index(1_001))
            .count() as u64;
        assert_eq!(h.snapshot().0[index(1_001)], same);
    }
}
