//! Small helpers shared by the scenarios: flag value parsers (durations such as `10s`,
//! `KEY=VALUE` pairs), human-readable formatting of latencies, and the bench process's
//! own resident memory and file-descriptor limit (Linux `/proc`).

use std::time::Duration;

/// Parses a duration flag: a non-negative number with a unit `ms`, `s`, `m` or `h`
/// (`500ms`, `10s`, `1.5m`, `2h`); a bare number means seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 2m"))?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("invalid duration unit {other:?} in {text:?}")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// Parses a `KEY=VALUE` flag (the key must be non-empty; the value may be empty).
pub fn parse_key_val(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// Formats a latency given in microseconds with a unit suited to its size
/// (`850us`, `1.23ms`, `2.50s`).
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{:.2}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// A Zipf distribution over ranks `0..n` (rank 0 the most frequent): P(k) is
/// proportional to `1 / (k + 1)^s`; `s = 0` is uniform. Sampled by binary search over
/// the precomputed cumulative weights (8 bytes per rank).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over `n` ranks (at least one) with exponent `s` (at least 0).
    pub fn new(n: usize, s: f64) -> Zipf {
        let s = s.max(0.0);
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut total = 0.0;
        for k in 0..n.max(1) {
            total += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// The rank for a uniform sample `u` in `[0, 1)`.
    pub fn rank(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }

    /// Probability of the `k` most frequent ranks together.
    pub fn top_share(&self, k: usize) -> f64 {
        match k {
            0 => 0.0,
            k => self.cdf[k.min(self.cdf.len()) - 1],
        }
    }
}

/// This process's resident set size in bytes (`VmRSS` of `/proc/self/status`).
pub fn self_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// This process's soft limit on open files (`Max open files` of `/proc/self/limits`).
pub fn max_open_files() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn key_values_and_latency_formatting() {
        assert_eq!(
            parse_key_val("IM_PERSIST_BATCH_MAX=64"),
            Ok(("IM_PERSIST_BATCH_MAX".into(), "64".into()))
        );
        assert_eq!(parse_key_val("A="), Ok(("A".into(), String::new())));
        assert!(parse_key_val("=1").is_err());
        assert!(parse_key_val("novalue").is_err());
        assert_eq!(fmt_us(850), "850us");
        assert_eq!(fmt_us(1_234), "1.23ms");
        assert_eq!(fmt_us(2_500_000), "2.50s");
    }

    #[test]
    fn zipf_ranks_follow_the_weights() {
        let z = Zipf::new(4, 1.0);
        // Weights 1, 1/2, 1/3, 1/4 over 25/12.
        assert!((z.top_share(1) - 12.0 / 25.0).abs() < 1e-9);
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.47), 0);
        assert_eq!(z.rank(0.49), 1);
        assert_eq!(z.rank(0.999_999), 3);
        assert_eq!(z.top_share(10), 1.0);
        let uniform = Zipf::new(10, 0.0);
        assert!((uniform.top_share(5) - 0.5).abs() < 1e-9);
        assert_eq!(Zipf::new(0, 1.0).rank(0.5), 0);
        let hot = Zipf::new(10_000, 1.1);
        let mut counts = vec![0u32; 10_000];
        for i in 0..100_000 {
            counts[hot.rank((i as f64 + 0.5) / 100_000.0)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[1000]);
    }

    #[test]
    fn own_process_figures_are_read() {
        assert!(self_rss_bytes().is_some_and(|b| b > 0));
        assert!(max_open_files().is_some_and(|n| n > 0));
    }
}
