//! The server's cost from `/proc`: CPU time (utime + stime) over the measured window
//! and RSS at its end, from `/proc/<pid>/stat` and `/proc/<pid>/status` of
//! `--server-pid` (or the `--spawn`ed im-server), and the report line they make.

use anyhow::Context;
use serde::Serialize;

use super::CommonArgs;
use crate::clock::Clock;
use crate::report::{fmt_bytes, line};
use crate::target::Target;

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux).
const USER_HZ: u64 = 100;

/// One reading of a process: CPU time so far and resident set size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// utime + stime, microseconds.
    pub cpu_us: u64,
    /// VmRSS, bytes.
    pub rss_bytes: u64,
}

/// utime + stime in clock ticks from the text of `/proc/PID/stat`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields resume after
    // the last ')'. There, index 0 is field 3 (state), so utime (14) is index 11.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS in bytes from the text of `/proc/PID/status`.
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let ticks = parse_stat_ticks(&stat).context("parsing /proc/PID/stat")?;
    let rss_bytes = parse_status_rss(&status).context("no VmRSS in /proc/PID/status")?;
    Ok(ProcSample {
        cpu_us: ticks * (1_000_000 / USER_HZ),
        rss_bytes,
    })
}

/// The pid to sample: `--server-pid`, else the spawned server's.
pub(super) fn server_pid(common: &CommonArgs, target: &Target) -> Option<u32> {
    let pid = common.server_pid.or_else(|| target.server_pid());
    if pid.is_none() {
        eprintln!("im-bench peer: no --server-pid: server CPU and RSS are not reported");
    }
    pid
}

pub(super) fn sample_opt(pid: Option<u32>) -> Option<ProcSample> {
    let pid = pid?;
    match sample(pid) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("im-bench peer: warning: {e:#}");
            None
        }
    }
}

/// Samples `pid` at the start and at the end of the clock's measured window.
pub(super) fn sample_window(
    pid: Option<u32>,
    clock: Clock,
) -> tokio::task::JoinHandle<(Option<ProcSample>, Option<ProcSample>)> {
    tokio::spawn(async move {
        tokio::time::sleep_until(clock.warmup_end).await;
        let a = sample_opt(pid);
        tokio::time::sleep_until(clock.end).await;
        (a, sample_opt(pid))
    })
}

/// The server's CPU over a window and its RSS at the end.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ServerCost {
    /// CPU microseconds used in the measured window.
    pub cpu_us: u64,
    /// CPU used as a share of one core over the window (1.0 = one core busy).
    pub cpu_cores: f64,
    /// RSS at the end of the window.
    pub rss_bytes: u64,
}

pub(super) fn cost(
    window: (Option<ProcSample>, Option<ProcSample>),
    secs: f64,
) -> Option<ServerCost> {
    let (a, b) = (window.0?, window.1?);
    let cpu_us = b.cpu_us.saturating_sub(a.cpu_us);
    Some(ServerCost {
        cpu_us,
        cpu_cores: if secs > 0.0 {
            cpu_us as f64 / 1e6 / secs
        } else {
            0.0
        },
        rss_bytes: b.rss_bytes,
    })
}

/// `cpu_us / n`, `None` when either is missing or `n` is 0.
pub(super) fn per(cost: Option<ServerCost>, n: u64) -> Option<f64> {
    let c = cost?;
    (n > 0).then(|| c.cpu_us as f64 / n as f64)
}

/// The server's line of a report: its CPU and RSS, and the CPU per delivery and per
/// message.
pub(super) fn cost_lines(
    s: &mut String,
    c: Option<ServerCost>,
    per_delivery: Option<f64>,
    per_msg: Option<f64>,
) {
    if let Some(c) = c {
        line(
            s,
            "server",
            format!(
                "{:.3} cores, rss {}; cpu per delivery {} µs, per message {} µs",
                c.cpu_cores,
                fmt_bytes(c.rss_bytes),
                per_delivery.map_or("-".into(), |v| format!("{v:.1}")),
                per_msg.map_or("-".into(), |v| format!("{v:.1}")),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse_even_with_odd_command_names() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 37 0 0 20 0 4 0 12345 1000000 500 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(287));
        assert_eq!(parse_stat_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_stat_ticks("no parenthesis"), None);
        let status = "Name:\tmosquitto\nVmPeak:\t  9000 kB\nVmRSS:\t   11680 kB\nThreads:\t1\n";
        assert_eq!(parse_status_rss(status), Some(11680 * 1024));
        assert_eq!(parse_status_rss("Name:\tx\n"), None);
        assert_eq!(parse_status_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(sample(u32::MAX).is_err());
    }
}
