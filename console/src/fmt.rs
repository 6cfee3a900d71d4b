//! Formatting of figures for display: bytes, rates, latencies, durations and Unix
//! timestamps (as UTC, so a render never depends on the machine's time zone).

use std::time::Duration;

/// `1536` -> `1.5 KiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Signed bytes per second: `+1.2 MiB/s`, `-300 B/s`.
pub fn byte_rate(v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "+" };
    format!("{sign}{}/s", bytes(v.abs().round() as u64))
}

/// A count with k/M suffixes: `1499.6` -> `1.5k`.
pub fn count(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a == a.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Microseconds, in the unit that fits: `0.26µs`, `24.6µs`, `2.6ms`, `1.20s`.
pub fn micros(us: f64) -> String {
    if us <= 0.0 {
        "-".to_owned()
    } else if us < 10.0 {
        format!("{us:.2}µs")
    } else if us < 1000.0 {
        format!("{us:.1}µs")
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// Seconds as `45s`, `3m 20s`, `2h 05m`, `3d 04h`.
pub fn secs(s: u64) -> String {
    let (d, h, m, sec) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d {h:02}h")
    } else if h > 0 {
        format!("{h}h {m:02}m")
    } else if m > 0 {
        format!("{m}m {sec:02}s")
    } else {
        format!("{sec}s")
    }
}

/// A duration as whole seconds ([`secs`]).
pub fn ago(d: Duration) -> String {
    secs(d.as_secs())
}

/// A ratio 0..1 as a percentage: `0.315` -> `31.5%`.
pub fn percent(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

/// Unix milliseconds as the UTC time of day with milliseconds, `HH:MM:SS.mmm`.
pub fn utc_time_ms(ms: i64) -> String {
    let rem = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// Unix milliseconds as `2026-12-02 15:07:00Z`.
pub fn utc_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, mo, d) = civil_from_days(days);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Cuts `s` to `width` characters, ending with `…` when cut.
pub fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(18_465_300), "17.6 MiB");
        assert_eq!(count(1499.6), "1.5k");
        assert_eq!(count(3.0), "3");
        assert_eq!(micros(0.256), "0.26µs");
        assert_eq!(micros(2621.44), "2.6ms");
        assert_eq!(secs(200), "3m 20s");
        assert_eq!(secs(7500), "2h 05m");
        assert_eq!(utc_ms(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc_ms(1_796_224_020_000), "2026-12-02 15:07:00Z");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(byte_rate(-300.0), "-300 B/s");
    }
}
