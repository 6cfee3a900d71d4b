//! Small helpers shared by the scenarios: flag value parsers (durations such as `10s`,
//! `KEY=VALUE` pairs) and human-readable formatting of latencies.

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
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
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
}
