//! `im-bench soak`: a long run of steady mixed load, sampled every window (the team's
//! soak goal: "RSS after warm-up grows < 2%, P99 does not drift, nothing lost; the heap
//! profile shows what, if anything, grows").
//!
//! The load is a [`chaos`] run (its flags, all of them): paced one-to-one pairs with the
//! size mix (`--mix`), a share of connections killed and reconnected every
//! `--kill-every` (they sync and resend, and exactly-once still holds), slow receivers
//! (`--slow-receivers`) the server must mark slow and bound, and no malformed frames
//! unless asked. `bench/configs/soak.toml` holds the shape of the 30-minute run.
//!
//! Beside it, every `--sample-every` of the measured window, a sample: the server's RSS,
//! jemalloc `allocated`, CPU seconds and slow consumers (admin overview), the machine's
//! load average, and the window's own send->ack and delivery P50/P99 (the difference of
//! the run's cumulative histograms; the slow receivers' deliveries are left out) and
//! message counts. At `--profile-at` (default the middle) a heap profile, then a CPU
//! profile, each of `--profile-for`, are taken through the admin API and saved in
//! `--profile-dir` (`heap.pb.gz`, `heap.svg`, `cpu.pb.gz`, `cpu.svg`). One after the
//! other, so that the heap window does not hold the CPU profiler's own allocations
//! (symbolizing a CPU profile allocates tens of MiB of debug-info tables).
//!
//! At the end: RSS and jemalloc `allocated` growth from window `--rss-baseline-window`
//! to the last, in percent, and again from the first window after the profiles (so the
//! profilers' own memory is not counted as growth);
//! P99 drift (median P99 of the last `--period-windows` windows against the first);
//! the samples merged into periods of `--period-windows`; the chaos report. It fails
//! (exit 1) exactly when the chaos run does: a loss, duplicate or reordering, a
//! connection lost without a kill, a victim that never came back. The goals (growth,
//! drift) are figures, not a verdict: the machine's noise is in the P99.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;
use hdrhistogram::Histogram;
use im_admin_api::{HeapTopFunction, TopFunction};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::chaos::{self, ChaosArgs, ChaosBody, Live, LiveCounts};
use crate::admin::AdminClient;
use crate::report::{self, fmt_bytes};
use crate::run::{Head, Report};
use crate::target::Target;
use crate::util::{fmt_us, parse_duration};

/// Entries of each profile's top list kept in the report.
const TOP_KEPT: usize = 10;
/// Longest heap profile the server takes.
const HEAP_MAX_SECS: u64 = 60;
/// Longest CPU profile the server takes.
const CPU_MAX_SECS: u64 = 300;
/// CPU profile sampling frequency, Hz.
const CPU_HZ: u64 = 99;

/// Flags of `im-bench soak`: chaos's, and the sampling and profiling.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// The load (every flag of `chaos`).
    #[command(flatten)]
    pub chaos: ChaosArgs,
    /// Length of one sample window.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sample_every: Duration,
    /// The window (1 = the first after the warmup) RSS growth is measured from.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rss_baseline_window: u32,
    /// Windows per period of the summary, and in each end of the P99 drift.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub period_windows: u32,
    /// When the profiles start, from the start of the measured window (default: both
    /// centred on the middle).
    #[arg(long, value_parser = parse_duration)]
    pub profile_at: Option<Duration>,
    /// Length of the CPU and heap profiles (0: none; the heap one at most 60 s).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub profile_for: Duration,
    /// Directory the profiles are written to (created).
    #[arg(long, default_value = "soak-profiles")]
    pub profile_dir: PathBuf,
}

/// One sample window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Window number, 1 = the first after the warmup.
    pub window: u32,
    /// End of the window, seconds from the start of the measured window.
    pub end_secs: f64,
    /// Server RSS at the end of the window (admin overview; `None`: not read).
    pub rss_bytes: Option<u64>,
    /// jemalloc `allocated` at the end of the window.
    pub heap_allocated_bytes: Option<u64>,
    /// jemalloc `resident` (pages of the heap in memory, freed ones not yet purged
    /// included): with `allocated` and RSS, where RSS that the heap does not explain sits.
    pub heap_resident_bytes: Option<u64>,
    /// The file-backed part of the server's RSS (its binary's pages as they are
    /// touched, SQLite's shared-memory index).
    pub rss_file_bytes: Option<u64>,
    /// Bytes the embedded SQLite holds (page caches, statements; outside jemalloc).
    pub sqlite_bytes: Option<u64>,
    /// Bytes the C allocator (SQLite's) has taken from the system.
    pub c_heap_bytes: Option<u64>,
    /// Server CPU seconds since its start.
    pub server_cpu_seconds: Option<f64>,
    /// Connections the server holds.
    pub connections: Option<u64>,
    /// Connections the server has marked slow now.
    pub slow_consumers: Option<u64>,
    /// Slow-consumer closes since the server started.
    pub slow_consumer_disconnects: Option<u64>,
    /// The machine's 1-minute load average.
    pub load_avg_1m: Option<f64>,
    /// What the run counted in this window (deltas).
    #[serde(flatten)]
    pub counts: LiveCounts,
    /// Send->ack latency of the acks of this window (µs).
    pub send_to_ack_p50_us: u64,
    /// Send->ack P99 (µs).
    pub send_to_ack_p99_us: u64,
    /// Send->receipt latency of this window's deliveries (µs).
    pub deliver_p50_us: u64,
    /// Send->receipt P99 (µs).
    pub deliver_p99_us: u64,
}

/// Consecutive windows merged.
#[derive(Debug, Clone, Serialize)]
pub struct Period {
    /// First window.
    pub first_window: u32,
    /// Last window.
    pub last_window: u32,
    /// RSS at the end of the last window.
    pub rss_bytes: Option<u64>,
    /// Send->ack P99 over the period (µs).
    pub send_to_ack_p99_us: u64,
    /// Delivery P99 over the period (µs).
    pub deliver_p99_us: u64,
    /// Acks in the period.
    pub acked: u64,
    /// Deliveries in the period.
    pub delivered: u64,
}

/// A P99 at the start of the run against the end.
#[derive(Debug, Clone, Serialize)]
pub struct Drift {
    /// Median of the first windows' P99 (µs).
    pub first_p99_us: u64,
    /// Median of the last windows' P99 (µs).
    pub last_p99_us: u64,
    /// Change, percent of the first.
    pub change_pct: f64,
}

/// The profiles taken in the middle.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Profiles {
    /// Start, seconds from the start of the measured window.
    pub at_secs: f64,
    /// When both had ended, seconds from the start of the measured window.
    pub end_secs: f64,
    /// Where the files are.
    pub dir: PathBuf,
    /// CPU profile: samples taken.
    pub cpu_samples: u64,
    /// CPU profile: functions by self samples.
    pub cpu_top: Vec<TopFunction>,
    /// Heap profile window, seconds.
    pub heap_secs: u64,
    /// Heap profile: bytes allocated in the window and still live at its end (estimate).
    pub heap_inuse_bytes: u64,
    /// Heap profile: allocation sites by self bytes.
    pub heap_top: Vec<HeapTopFunction>,
    /// What failed (a capture or a file).
    pub errors: Vec<String>,
}

/// The final report of a soak run.
pub type SoakReport = Report<SoakBody>;

/// The soak report's own fields.
#[derive(Debug, Clone, Serialize)]
pub struct SoakBody {
    /// Which scenario ran, and against which endpoint.
    #[serde(flatten)]
    pub head: Head,
    /// Window length, seconds.
    pub sample_every_secs: f64,
    /// Window RSS growth is measured from.
    pub rss_baseline_window: u32,
    /// RSS at the end of that window.
    pub rss_baseline_bytes: Option<u64>,
    /// RSS at the end of the last window.
    pub rss_last_bytes: Option<u64>,
    /// (last - baseline) / baseline, percent.
    pub rss_growth_pct: Option<f64>,
    /// jemalloc `allocated`, same windows, percent.
    pub heap_growth_pct: Option<f64>,
    /// The first window that started after the profiles had ended.
    pub after_profiles_window: Option<u32>,
    /// RSS growth from that window to the last, percent.
    pub rss_growth_after_profiles_pct: Option<f64>,
    /// jemalloc `allocated` growth from that window to the last, percent.
    pub heap_growth_after_profiles_pct: Option<f64>,
    /// Send->ack P99, first windows against the last.
    pub send_to_ack_drift: Option<Drift>,
    /// Delivery P99, first windows against the last.
    pub deliver_drift: Option<Drift>,
    /// Every window.
    pub samples: Vec<Sample>,
    /// Windows merged by `--period-windows`.
    pub periods: Vec<Period>,
    /// The profiles (`None`: `--profile-for 0`).
    pub profiles: Option<Profiles>,
    /// The load's own report.
    pub chaos: ChaosBody,
}

scenario! {
    "soak", SoakArgs => SoakBody,
    correctness: crate::check::Verdict, server: Option<crate::admin::ServerFigures>,
    target: chaos.server, json: chaos.run.json,
}

/// A window's sample and its two latency histograms (send->ack, delivery).
type Window = (Sample, Histogram<u64>, Histogram<u64>);
/// The tasks beside the load: the sampler, and the profiles (when taken).
type Watchers = (JoinHandle<Vec<Window>>, Option<JoinHandle<Profiles>>);

async fn run_against(args: &SoakArgs, target: &mut Target) -> anyhow::Result<SoakReport> {
    let Some(admin) = target.admin().cloned() else {
        anyhow::bail!(
            "soak reads the server's admin API: use --spawn, or --admin-url and --admin-token"
        );
    };
    if args.sample_every.is_zero() {
        anyhow::bail!("--sample-every must be positive");
    }
    let profile_for = args.profile_for.as_secs().min(CPU_MAX_SECS);
    let measured = args.chaos.run.duration;
    // The two profiles (heap, then CPU) centred on the middle.
    let profile_at = args
        .profile_at
        .unwrap_or_else(|| (measured / 2).saturating_sub(Duration::from_secs(profile_for)));
    let mut tasks: Option<Watchers> = None;
    let chaos_report = chaos::run_observed(&args.chaos, target, |live| {
        let clock = live.clock();
        let profiles = (profile_for > 0).then(|| {
            let at = clock.warmup_end + profile_at;
            let dir = args.profile_dir.clone();
            tokio::spawn(take_profiles(
                admin.clone(),
                at,
                profile_for,
                dir,
                profile_at,
            ))
        });
        let sampler = tokio::spawn(sample_windows(live, admin.clone(), args.sample_every));
        tasks = Some((sampler, profiles));
    })
    .await?;
    let (sampler, profiles) = tasks.ok_or_else(|| anyhow::anyhow!("the run did not start"))?;
    let windows = sampler.await?;
    let profiles = match profiles {
        Some(h) => Some(h.await?),
        None => None,
    };
    let body = summarize(
        args,
        Head::new("soak", target),
        windows,
        profiles,
        chaos_report.body,
    );
    Ok(Report {
        body,
        tail: chaos_report.tail,
    })
}

/// The report body from the windows: growth, drift, periods.
fn summarize(
    args: &SoakArgs,
    head: Head,
    windows: Vec<Window>,
    profiles: Option<Profiles>,
    chaos: ChaosBody,
) -> SoakBody {
    let k = args.period_windows as usize;
    let every = args.sample_every.as_secs_f64();
    let at = |w: u32| windows.iter().find(|x| x.0.window == w).map(|x| &x.0);
    let last = windows.last().map(|x| &x.0);
    let rss = |s: Option<&Sample>| s.and_then(|s| s.rss_bytes);
    let heap = |s: Option<&Sample>| s.and_then(|s| s.heap_allocated_bytes);
    let base = at(args.rss_baseline_window);
    let after_profiles_window = profiles.as_ref().and_then(|p| {
        let w = windows
            .iter()
            .find(|x| x.0.end_secs - every >= p.end_secs)?;
        Some(w.0.window)
    });
    let after = after_profiles_window.and_then(at);
    let p99s = |f: fn(&Sample) -> u64| -> Vec<u64> { windows.iter().map(|w| f(&w.0)).collect() };
    let periods = windows.chunks(k).map(period).collect();
    SoakBody {
        head,
        sample_every_secs: args.sample_every.as_secs_f64(),
        rss_baseline_window: args.rss_baseline_window,
        rss_baseline_bytes: rss(base),
        rss_last_bytes: rss(last),
        rss_growth_pct: growth(rss(base), rss(last)),
        heap_growth_pct: growth(heap(base), heap(last)),
        after_profiles_window,
        rss_growth_after_profiles_pct: growth(rss(after), rss(last)),
        heap_growth_after_profiles_pct: growth(heap(after), heap(last)),
        send_to_ack_drift: drift(&p99s(|s| s.send_to_ack_p99_us), k),
        deliver_drift: drift(&p99s(|s| s.deliver_p99_us), k),
        samples: windows.into_iter().map(|w| w.0).collect(),
        periods,
        profiles,
        chaos,
    }
}

/// (b - a) / a in percent, when both are known and `a` is not zero.
fn growth(a: Option<u64>, b: Option<u64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a > 0 => Some((b as f64 - a as f64) / a as f64 * 100.0),
        _ => None,
    }
}

/// Consecutive windows as one period (their histograms merged).
fn period(ws: &[Window]) -> Period {
    let mut ack = ws[0].1.clone();
    let mut del = ws[0].2.clone();
    for w in &ws[1..] {
        // Same bounds on both sides: adding cannot fail.
        let _ = ack.add(&w.1);
        let _ = del.add(&w.2);
    }
    let last = &ws[ws.len() - 1].0;
    Period {
        first_window: ws[0].0.window,
        last_window: last.window,
        rss_bytes: last.rss_bytes,
        send_to_ack_p99_us: p(&ack, 0.99),
        deliver_p99_us: p(&del, 0.99),
        acked: ws.iter().map(|w| w.0.counts.acked).sum(),
        delivered: ws.iter().map(|w| w.0.counts.delivered).sum(),
    }
}

/// Median P99 of the first `k` windows against the last `k` (`k` at most half of them).
fn drift(p99s: &[u64], k: usize) -> Option<Drift> {
    let k = k.min(p99s.len() / 2);
    if k == 0 {
        return None;
    }
    let first = median(&p99s[..k]);
    let last = median(&p99s[p99s.len() - k..]);
    let change_pct = if first > 0 {
        (last as f64 - first as f64) / first as f64 * 100.0
    } else {
        0.0
    };
    Some(Drift {
        first_p99_us: first,
        last_p99_us: last,
        change_pct,
    })
}

/// The median (the lower middle of an even count).
fn median(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get((v.len().saturating_sub(1)) / 2).copied().unwrap_or(0)
}

/// A quantile of `h` (0 when empty).
fn p(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

/// Samples every `every` from the end of the warmup to the end of the measured window
/// (the last window may be shorter).
async fn sample_windows(live: Live, admin: AdminClient, every: Duration) -> Vec<Window> {
    let clock = live.clock();
    tokio::time::sleep_until(clock.warmup_end).await;
    let (mut ack0, mut del0, mut c0) = (live.ack_latency(), live.deliver_latency(), live.counts());
    let mut out = Vec::new();
    for n in 1u32.. {
        let at = (clock.warmup_end + every * n).min(clock.end);
        tokio::time::sleep_until(at).await;
        let (ack1, del1, c1) = (live.ack_latency(), live.deliver_latency(), live.counts());
        let figures = admin.try_figures().await;
        let memory = figures.as_ref().and_then(|f| f.memory.as_ref());
        let (mut ack, mut del) = (ack1.clone(), del1.clone());
        // Cumulative histograms only grow: the earlier one is contained in the later.
        let _ = ack.subtract(&ack0);
        let _ = del.subtract(&del0);
        let sample = Sample {
            window: n,
            end_secs: at.saturating_duration_since(clock.warmup_end).as_secs_f64(),
            rss_bytes: figures.as_ref().map(|f| f.rss_bytes),
            heap_allocated_bytes: memory.map(|m| m.allocated),
            heap_resident_bytes: memory.map(|m| m.resident),
            rss_file_bytes: memory.map(|m| m.rss_file),
            sqlite_bytes: memory.map(|m| m.sqlite),
            c_heap_bytes: memory.map(|m| m.c_heap),
            server_cpu_seconds: figures.as_ref().map(|f| f.cpu_seconds),
            connections: figures.as_ref().map(|f| f.connections),
            slow_consumers: figures.as_ref().map(|f| f.slow_consumers),
            slow_consumer_disconnects: figures.as_ref().map(|f| f.slow_consumer_disconnects),
            load_avg_1m: load_average(),
            counts: delta(c1, c0),
            send_to_ack_p50_us: p(&ack, 0.5),
            send_to_ack_p99_us: p(&ack, 0.99),
            deliver_p50_us: p(&del, 0.5),
            deliver_p99_us: p(&del, 0.99),
        };
        eprintln!("{}", sample_line(&sample));
        out.push((sample, ack, del));
        (ack0, del0, c0) = (ack1, del1, c1);
        if at >= clock.end {
            break;
        }
    }
    out
}

/// Counts of a window: `now - before`.
fn delta(now: LiveCounts, before: LiveCounts) -> LiveCounts {
    LiveCounts {
        sent: now.sent.saturating_sub(before.sent),
        acked: now.acked.saturating_sub(before.acked),
        delivered: now.delivered.saturating_sub(before.delivered),
        kills: now.kills.saturating_sub(before.kills),
        slow_closed: now.slow_closed.saturating_sub(before.slow_closed),
        slow_unseen: now.slow_unseen.saturating_sub(before.slow_unseen),
        unexpected_disconnects: now
            .unexpected_disconnects
            .saturating_sub(before.unexpected_disconnects),
    }
}

/// The machine's 1-minute load average (Linux).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// One sample as a progress line.
fn sample_line(s: &Sample) -> String {
    format!(
        "im-bench soak: window {:>3} ({:>6.0}s): rss {}, heap {}, load {:.1}, acked {}, delivered {}, kills {}, slow closes {} (+{} unseen), slow now {}, p99 send->ack {}, p99 deliver {}",
        s.window,
        s.end_secs,
        s.rss_bytes.map_or("?".into(), fmt_bytes),
        s.heap_allocated_bytes.map_or("?".into(), fmt_bytes),
        s.load_avg_1m.unwrap_or(0.0),
        s.counts.acked,
        s.counts.delivered,
        s.counts.kills,
        s.counts.slow_closed,
        s.counts.slow_unseen,
        s.slow_consumers.unwrap_or(0),
        fmt_us(s.send_to_ack_p99_us),
        fmt_us(s.deliver_p99_us),
    )
}

/// At `at` (`offset` into the measured window), a heap profile, then a CPU profile, each
/// of `secs`, saved in `dir`.
async fn take_profiles(
    admin: AdminClient,
    at: Instant,
    secs: u64,
    dir: PathBuf,
    offset: Duration,
) -> Profiles {
    tokio::time::sleep_until(at).await;
    let out = profile_now(&admin, secs, dir, offset).await;
    Profiles {
        end_secs: offset.as_secs_f64() + at.elapsed().as_secs_f64(),
        ..out
    }
}

/// The two captures of [`take_profiles`], one after the other.
async fn profile_now(admin: &AdminClient, secs: u64, dir: PathBuf, offset: Duration) -> Profiles {
    let heap_secs = secs.clamp(1, HEAP_MAX_SECS);
    eprintln!(
        "im-bench soak: profiling (heap {heap_secs}s, then CPU {secs}s) into {}",
        dir.display()
    );
    let mut out = Profiles {
        at_secs: offset.as_secs_f64(),
        dir: dir.clone(),
        heap_secs,
        ..Profiles::default()
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        out.errors.push(format!("creating {}: {e}", dir.display()));
        return out;
    }
    match admin.heap_profile(heap_secs).await {
        Ok(b) => {
            save(&dir, "heap", &b.pprof_gz_base64, &b.svg, &mut out.errors);
            out.heap_inuse_bytes = b.inuse_bytes;
            out.heap_top = b.top.into_iter().take(TOP_KEPT).collect();
        }
        Err(e) => out.errors.push(format!("{e:#}")),
    }
    match admin.cpu_profile(secs, CPU_HZ).await {
        Ok(b) => {
            save(&dir, "cpu", &b.pprof_gz_base64, &b.svg, &mut out.errors);
            out.cpu_samples = b.samples;
            out.cpu_top = b.top.into_iter().take(TOP_KEPT).collect();
        }
        Err(e) => out.errors.push(format!("{e:#}")),
    }
    out
}

/// Writes `NAME.pb.gz` (from base64) and `NAME.svg` into `dir`; failures into `errors`.
fn save(dir: &Path, name: &str, pprof_b64: &str, svg: &str, errors: &mut Vec<String>) {
    let pprof = match base64::engine::general_purpose::STANDARD.decode(pprof_b64) {
        Ok(b) => b,
        Err(e) => {
            errors.push(format!("{name} profile: bad base64: {e}"));
            return;
        }
    };
    for (file, bytes) in [
        (format!("{name}.pb.gz"), pprof.as_slice()),
        (format!("{name}.svg"), svg.as_bytes()),
    ] {
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, bytes) {
            errors.push(format!("writing {}: {e}", path.display()));
        }
    }
}

/// The text form of a report: the periods, growth, drift, profiles, then the load's
/// report.
pub fn render(r: &SoakReport) -> String {
    let mut s = format!(
        "im-bench soak: {} windows of {:.0}s, {}\n",
        r.samples.len(),
        r.sample_every_secs,
        r.head.url
    );
    for p in &r.periods {
        report::line(
            &mut s,
            &format!("windows {:>2}-{:<2}", p.first_window, p.last_window),
            format!(
                "rss {}, p99 send->ack {}, p99 deliver {}, {} acked, {} delivered",
                p.rss_bytes.map_or("?".into(), fmt_bytes),
                fmt_us(p.send_to_ack_p99_us),
                fmt_us(p.deliver_p99_us),
                p.acked,
                p.delivered
            ),
        );
    }
    let pct = |g: Option<f64>| g.map_or("unknown".into(), |g| format!("{g:+.2}%"));
    report::line(
        &mut s,
        "growth",
        format!(
            "rss {}, heap allocated {} from window {} to the last",
            pct(r.rss_growth_pct),
            pct(r.heap_growth_pct),
            r.rss_baseline_window
        ),
    );
    if let Some(w) = r.after_profiles_window {
        report::line(
            &mut s,
            "",
            format!(
                "rss {}, heap allocated {} from window {w} (after the profiles) to the last",
                pct(r.rss_growth_after_profiles_pct),
                pct(r.heap_growth_after_profiles_pct)
            ),
        );
    }
    for (name, d) in [
        ("p99 send->ack", &r.send_to_ack_drift),
        ("p99 deliver", &r.deliver_drift),
    ] {
        if let Some(d) = d {
            report::line(
                &mut s,
                &format!("{name} drift"),
                format!(
                    "{} first, {} last ({:+.1}%)",
                    fmt_us(d.first_p99_us),
                    fmt_us(d.last_p99_us),
                    d.change_pct
                ),
            );
        }
    }
    if let Some(p) = &r.profiles {
        profile_lines(&mut s, p);
    }
    let chaos = Report {
        body: r.chaos.clone(),
        tail: r.tail.clone(),
    };
    s.push_str(&chaos::render(&chaos));
    s
}

/// The profiles' lines of the text report.
fn profile_lines(s: &mut String, p: &Profiles) {
    report::line(
        s,
        "profiles",
        format!(
            "{:.0}-{:.0}s into {}: CPU {} samples, heap {} live from the {}s window",
            p.at_secs,
            p.end_secs,
            p.dir.display(),
            p.cpu_samples,
            fmt_bytes(p.heap_inuse_bytes),
            p.heap_secs
        ),
    );
    for t in p.heap_top.iter().take(5) {
        report::line(
            s,
            "  heap",
            format!("{} {}", fmt_bytes(t.self_bytes), t.function),
        );
    }
    for e in &p.errors {
        report::line(s, "  profile error", e.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_compares_medians_of_both_ends() {
        let d = drift(&[10, 30, 20, 99, 99, 40, 60, 50], 3).unwrap();
        assert_eq!((d.first_p99_us, d.last_p99_us), (20, 50));
        assert!((d.change_pct - 150.0).abs() < 1e-9);
        // Fewer windows than two ends: each end gets half.
        let d = drift(&[10, 20, 30], 5).unwrap();
        assert_eq!((d.first_p99_us, d.last_p99_us), (10, 30));
        assert!(drift(&[10], 5).is_none());
    }

    #[test]
    fn soak_flags_include_chaos_flags() {
        let parsed = crate::parse_scenario(&[
            "soak",
            "--senders",
            "50",
            "--slow-receivers",
            "1",
            "--mix",
            "text:8:50-200,image:2:10000-20000",
            "--sample-every",
            "2s",
        ])
        .unwrap();
        let crate::scenarios::Scenario::Soak(a) = parsed else {
            panic!("not soak")
        };
        assert_eq!((a.chaos.senders, a.chaos.slow_receivers), (50, 1));
        assert_eq!(a.chaos.mix.map(|m| m.0.len()), Some(2));
        assert_eq!(a.sample_every, Duration::from_secs(2));
        assert_eq!(a.rss_baseline_window, 3);
    }
}
