//! The log compactor: compresses rotated log files with zstd only inside the off-peak
//! window or while the node is idle, on a low-priority thread with a CPU cap, and deletes
//! files past retention (no CPU spike at the top of the hour).
//!
//! Owns the log directory's file states ([`list`]: active, rotated, compressed), the
//! window arithmetic ([`Window`]) and the [`Compactor`] itself. Its clock ([`Clock`]) and
//! its view of the node's message rate (a closure) are injected, so a test drives
//! [`Compactor::tick`] with a fake time of day and load.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, FixedOffset, NaiveTime, TimeDelta};
use serde::Serialize;

/// Extension of compressed files.
pub const COMPRESSED_EXT: &str = "zst";
/// Suffix of a compression in progress.
const TMP_SUFFIX: &str = ".zst.tmp";
/// Bytes compressed between CPU-cap pauses and window checks.
const CHUNK: usize = 256 * 1024;

/// A local time of day, minute precision (`HH:MM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimeOfDay {
    minutes: u32,
}

impl TimeOfDay {
    /// Parses `HH:MM` (00:00 to 23:59).
    pub fn parse(s: &str) -> Result<TimeOfDay, String> {
        let bad = || format!("{s:?} is not a time of day (use HH:MM, 00:00 to 23:59)");
        let (h, m) = s.trim().split_once(':').ok_or_else(bad)?;
        let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
        if h > 23 || m > 59 || s.trim().len() != 5 {
            return Err(bad());
        }
        Ok(TimeOfDay {
            minutes: h * 60 + m,
        })
    }

    fn naive(self) -> NaiveTime {
        NaiveTime::from_hms_opt(self.minutes / 60, self.minutes % 60, 0).unwrap_or_default()
    }
}

impl std::fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02}:{:02}", self.minutes / 60, self.minutes % 60)
    }
}

/// The off-peak window, `[start, end)` in local time; wraps midnight when end < start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Opens at.
    pub start: TimeOfDay,
    /// Closes at.
    pub end: TimeOfDay,
}

impl Window {
    /// Parses `log.window_start` and `log.window_end`; the error names the key.
    pub fn parse(start: &str, end: &str) -> Result<Window, String> {
        let start =
            TimeOfDay::parse(start).map_err(|e| format!("config key `log.window_start`: {e}"))?;
        let end = TimeOfDay::parse(end).map_err(|e| format!("config key `log.window_end`: {e}"))?;
        Ok(Window { start, end })
    }

    /// Whether local time `t` is inside the window.
    pub fn contains(&self, t: NaiveTime) -> bool {
        let (s, e) = (self.start.naive(), self.end.naive());
        if s < e {
            s <= t && t < e
        } else {
            t >= s || t < e
        }
    }

    /// The next opening strictly after `now` (in `now`'s offset).
    pub fn next_start(&self, now: DateTime<FixedOffset>) -> DateTime<FixedOffset> {
        let today = now.date_naive().and_time(self.start.naive());
        let mut at = today
            .and_local_timezone(*now.offset())
            .single()
            .unwrap_or(now);
        if at <= now {
            at += TimeDelta::days(1);
        }
        at
    }
}

/// Where the compactor gets the time: the system's local clock, or a test's.
pub trait Clock: Send + 'static {
    /// Now, with the local UTC offset.
    fn now(&self) -> DateTime<FixedOffset>;
}

/// The local system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<FixedOffset> {
        chrono::Local::now().fixed_offset()
    }
}

/// What a log file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileState {
    /// Being written (the newest uncompressed file).
    Active,
    /// Closed by rotation, not yet compressed.
    Rotated,
    /// Compressed (`.zst`).
    Compressed,
}

/// One file of the log directory.
#[derive(Debug, Clone, Serialize)]
pub struct LogFile {
    /// File name.
    pub name: String,
    /// Size on disk.
    pub size_bytes: u64,
    /// Active, rotated or compressed.
    pub state: FileState,
    /// Last modification, ms since the Unix epoch.
    pub modified_ms: u64,
    #[serde(skip)]
    modified: SystemTime,
}

/// Lists the log files of `dir` named `<prefix>.*`, by name. The newest uncompressed one
/// (file names carry the period, so they sort by time) is the one being written.
pub fn list(dir: &Path, prefix: &str) -> io::Result<Vec<LogFile>> {
    let mut files = Vec::new();
    let lead = format!("{prefix}.");
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with(&lead) || name.ends_with(TMP_SUFFIX) {
            continue;
        }
        let meta = match e.metadata() {
            Ok(m) if m.is_file() => m,
            _ => continue,
        };
        let modified = meta.modified().unwrap_or(UNIX_EPOCH);
        let compressed = name.ends_with(&format!(".{COMPRESSED_EXT}"));
        files.push(LogFile {
            name,
            size_bytes: meta.len(),
            state: if compressed {
                FileState::Compressed
            } else {
                FileState::Rotated
            },
            modified_ms: modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            modified,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(f) = files
        .iter_mut()
        .rev()
        .find(|f| f.state == FileState::Rotated)
    {
        f.state = FileState::Active;
    }
    Ok(files)
}

/// Running totals of the log files, shared with the admin API and the metrics.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Bytes written to log files.
    pub written: AtomicU64,
    /// Bytes of rotated files compressed (input size).
    pub compressed: AtomicU64,
    /// Files compressed.
    pub compressed_files: AtomicU64,
    /// Files deleted for retention.
    pub deleted_files: AtomicU64,
    /// The compactor's last view: the node counts as idle.
    pub idle: AtomicBool,
}

/// Compactor settings.
#[derive(Debug, Clone)]
pub struct CompactorConfig {
    /// The log directory.
    pub dir: PathBuf,
    /// File name prefix.
    pub prefix: String,
    /// Off-peak window.
    pub window: Window,
    /// Rotated and compressed files older than this are deleted.
    pub retention: Duration,
    /// Idle below this many messages per second (0: never idle).
    pub idle_msgs_per_sec: f64,
    /// ... for this long.
    pub idle_for: Duration,
    /// zstd level.
    pub zstd_level: i32,
    /// Share of one core used while compressing (sleeps between chunks make up the rest).
    pub cpu_share: f64,
}

/// What one tick did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    /// Compression was allowed (in the window or idle).
    pub allowed: bool,
    /// Files compressed (original names).
    pub compressed: Vec<String>,
    /// Files deleted for retention.
    pub deleted: Vec<String>,
}

/// The compactor: call [`Compactor::tick`] periodically (see [`spawn`]).
pub struct Compactor<C: Clock> {
    cfg: CompactorConfig,
    clock: C,
    rate: Box<dyn FnMut() -> f64 + Send>,
    idle_since: Option<DateTime<FixedOffset>>,
    stats: Arc<LogStats>,
    stop: Arc<AtomicBool>,
}

impl<C: Clock> Compactor<C> {
    /// A compactor over `cfg.dir`, reading the time from `clock` and the node's message
    /// rate (in + out per second) from `rate`.
    pub fn new(
        cfg: CompactorConfig,
        clock: C,
        rate: Box<dyn FnMut() -> f64 + Send>,
        stats: Arc<LogStats>,
    ) -> Self {
        Compactor {
            cfg,
            clock,
            rate,
            idle_since: None,
            stats,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the node has been idle long enough at `now` (updates the idle clock).
    fn idle(&mut self, now: DateTime<FixedOffset>) -> bool {
        let quiet = self.cfg.idle_msgs_per_sec > 0.0 && (self.rate)() < self.cfg.idle_msgs_per_sec;
        if !quiet {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
        let idle = self
            .idle_since
            .is_some_and(|s| (now - s).to_std().unwrap_or_default() >= self.cfg.idle_for);
        self.stats.idle.store(idle, Ordering::Relaxed);
        idle
    }

    fn allowed(&mut self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = self.clock.now();
        let idle = self.idle(now);
        idle || self.cfg.window.contains(now.time())
    }

    /// One pass: delete files past retention; then, inside the window or while idle,
    /// compress every rotated file (oldest first), re-checking between chunks.
    pub fn tick(&mut self) -> TickReport {
        let mut report = TickReport::default();
        let files = match list(&self.cfg.dir, &self.cfg.prefix) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %self.cfg.dir.display(), error = %e, "log compactor cannot list the log directory");
                return report;
            }
        };
        let now: SystemTime = self.clock.now().into();
        for f in files.iter().filter(|f| f.state != FileState::Active) {
            let age = now.duration_since(f.modified).unwrap_or_default();
            if age > self.cfg.retention {
                match fs::remove_file(self.cfg.dir.join(&f.name)) {
                    Ok(()) => {
                        self.stats.deleted_files.fetch_add(1, Ordering::Relaxed);
                        report.deleted.push(f.name.clone());
                    }
                    Err(e) => {
                        tracing::warn!(file = %f.name, error = %e, "cannot delete an expired log file")
                    }
                }
            }
        }
        report.allowed = self.allowed();
        if !report.allowed {
            return report;
        }
        for f in files
            .iter()
            .filter(|f| f.state == FileState::Rotated && !report.deleted.contains(&f.name))
        {
            let path = self.cfg.dir.join(&f.name);
            let (level, share) = (self.cfg.zstd_level, self.cfg.cpu_share);
            let mut keep_going = || self.allowed();
            match compress_file(&path, level, share, &mut keep_going) {
                Ok(Some(n)) => {
                    self.stats.compressed.fetch_add(n, Ordering::Relaxed);
                    self.stats.compressed_files.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("im_log_compressed_bytes_total").increment(n);
                    report.compressed.push(f.name.clone());
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(file = %f.name, error = %e, "log compression failed; will retry");
                }
            }
        }
        report
    }
}

/// Compresses `src` to `src.zst` in chunks, pausing after each so the thread uses at most
/// `cpu_share` of a core, and stopping (output removed, `Ok(None)`) when `keep_going`
/// says no. On success the original is removed, the output keeps its modification time
/// (retention counts from when the log was written), and the input size is returned.
pub fn compress_file(
    src: &Path,
    level: i32,
    cpu_share: f64,
    keep_going: &mut dyn FnMut() -> bool,
) -> io::Result<Option<u64>> {
    let name = src
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = src.with_file_name(format!("{name}{TMP_SUFFIX}"));
    let dst = src.with_file_name(format!("{name}.{COMPRESSED_EXT}"));
    let result = (|| {
        let mut input = fs::File::open(src)?;
        let modified = input.metadata()?.modified()?;
        let mut enc = zstd::stream::Encoder::new(fs::File::create(&tmp)?, level)?;
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = input.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let t = Instant::now();
            enc.write_all(&buf[..n])?;
            total += n as u64;
            let busy = t.elapsed();
            if cpu_share < 1.0 {
                let pause = busy.mul_f64((1.0 - cpu_share) / cpu_share);
                std::thread::sleep(pause.min(Duration::from_secs(5)));
            }
            if !keep_going() {
                return Ok(None);
            }
        }
        let out = enc.finish()?;
        out.sync_all()?;
        out.set_modified(modified)?;
        drop(out);
        fs::rename(&tmp, &dst)?;
        fs::remove_file(src)?;
        Ok(Some(total))
    })();
    if !matches!(result, Ok(Some(_))) {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Lowers the calling thread's CPU priority (nice 19) and I/O priority (idle class).
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id; no memory is passed.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, 19) != 0 {
            tracing::debug!("setpriority failed: {}", io::Error::last_os_error());
        }
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << 13)
        libc::syscall(libc::SYS_ioprio_set, 1, tid, 3 << 13);
    }
}

/// A running compactor thread; stops when dropped or on [`CompactorHandle::stop`].
pub struct CompactorHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CompactorHandle {
    /// Asks the thread to stop after its current chunk and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for CompactorHandle {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Runs `compactor` every `interval` on a low-priority thread named `im-log-compactor`.
pub fn spawn<C: Clock>(
    mut compactor: Compactor<C>,
    interval: Duration,
) -> io::Result<CompactorHandle> {
    let stop = compactor.stop.clone();
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("im-log-compactor".into())
        .spawn(move || {
            lower_thread_priority();
            while !flag.load(Ordering::Relaxed) {
                let r = compactor.tick();
                if !r.compressed.is_empty() || !r.deleted.is_empty() {
                    tracing::info!(
                        compressed = r.compressed.len(),
                        deleted = r.deleted.len(),
                        "log compactor pass"
                    );
                }
                std::thread::park_timeout(interval);
            }
        })?;
    Ok(CompactorHandle {
        stop,
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A clock a test sets.
    #[derive(Clone)]
    struct FakeClock(Arc<Mutex<DateTime<FixedOffset>>>);

    impl Clock for FakeClock {
        fn now(&self) -> DateTime<FixedOffset> {
            *self.0.lock().unwrap()
        }
    }

    fn at(s: &str) -> DateTime<FixedOffset> {
        DateTime::parse_from_rfc3339(s).unwrap()
    }

    fn window(a: &str, b: &str) -> Window {
        Window {
            start: TimeOfDay::parse(a).unwrap(),
            end: TimeOfDay::parse(b).unwrap(),
        }
    }

    #[test]
    fn windows_contain_and_wrap() {
        let w = window("03:00", "05:00");
        let t = |s: &str| NaiveTime::parse_from_str(s, "%H:%M").unwrap();
        assert!(w.contains(t("03:00")) && w.contains(t("04:59")));
        assert!(!w.contains(t("05:00")) && !w.contains(t("02:59")));
        let wrap = window("23:00", "01:00");
        assert!(wrap.contains(t("23:30")) && wrap.contains(t("00:30")));
        assert!(!wrap.contains(t("01:00")) && !wrap.contains(t("12:00")));
        let now = at("2026-03-01T10:00:00+08:00");
        assert_eq!(w.next_start(now), at("2026-03-02T03:00:00+08:00"));
        let early = at("2026-03-01T01:00:00+08:00");
        assert_eq!(w.next_start(early), at("2026-03-01T03:00:00+08:00"));
        for bad in ["3:00", "24:00", "12:60", "noon", ""] {
            assert!(TimeOfDay::parse(bad).is_err(), "{bad}");
        }
    }

    fn setup(
        idle_rate: Arc<Mutex<f64>>,
    ) -> (tempfile::TempDir, FakeClock, Compactor<FakeClock>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        // Two rotated hours and the active one; the rotated ones are a few MB of log-like
        // lines so compression runs over several chunks.
        let mut original = Vec::new();
        for i in 0..60_000 {
            original.extend_from_slice(
                format!("{{\"timestamp\":\"2026-03-01T01:{:02}:00Z\",\"level\":\"INFO\",\"fields\":{{\"message\":\"line {i}\"}}}}\n", i % 60)
                    .as_bytes(),
            );
        }
        fs::write(dir.path().join("im-server.2026-03-01-01.log"), &original).unwrap();
        fs::write(dir.path().join("im-server.2026-03-01-02.log"), b"second\n").unwrap();
        fs::write(dir.path().join("im-server.2026-03-01-03.log"), b"active\n").unwrap();
        fs::write(dir.path().join("other.txt"), b"not ours").unwrap();
        // Written an hour before the test clock's noon.
        let written: SystemTime = at("2026-03-01T11:00:00+00:00").into();
        for e in fs::read_dir(dir.path()).unwrap() {
            let f = fs::File::options()
                .append(true)
                .open(e.unwrap().path())
                .unwrap();
            f.set_modified(written).unwrap();
        }
        let clock = FakeClock(Arc::new(Mutex::new(at("2026-03-01T12:00:00+00:00"))));
        let cfg = CompactorConfig {
            dir: dir.path().to_path_buf(),
            prefix: "im-server".into(),
            window: window("03:00", "05:00"),
            retention: Duration::from_secs(48 * 3600),
            idle_msgs_per_sec: 1.0,
            idle_for: Duration::from_secs(600),
            zstd_level: 3,
            cpu_share: 0.5,
        };
        let rate = idle_rate.clone();
        let c = Compactor::new(
            cfg,
            clock.clone(),
            Box::new(move || *rate.lock().unwrap()),
            Arc::new(LogStats::default()),
        );
        (dir, clock, c, original)
    }

    fn states(dir: &Path) -> Vec<(String, FileState)> {
        list(dir, "im-server")
            .unwrap()
            .into_iter()
            .map(|f| (f.name, f.state))
            .collect()
    }

    #[test]
    fn compresses_only_inside_the_window_and_round_trips() {
        let rate = Arc::new(Mutex::new(500.0));
        let (dir, clock, mut c, original) = setup(rate);
        // Noon, busy: nothing happens.
        let r = c.tick();
        assert!(!r.allowed && r.compressed.is_empty() && r.deleted.is_empty());
        assert_eq!(
            states(dir.path()),
            vec![
                ("im-server.2026-03-01-01.log".into(), FileState::Rotated),
                ("im-server.2026-03-01-02.log".into(), FileState::Rotated),
                ("im-server.2026-03-01-03.log".into(), FileState::Active),
            ]
        );
        // 02:59 local (+08:00): still outside.
        *clock.0.lock().unwrap() = at("2026-03-02T02:59:00+08:00");
        assert!(!c.tick().allowed);
        // 03:10 local: both rotated files are compressed, the active one is left alone.
        *clock.0.lock().unwrap() = at("2026-03-02T03:10:00+08:00");
        let r = c.tick();
        assert!(r.allowed);
        assert_eq!(
            r.compressed,
            vec![
                "im-server.2026-03-01-01.log".to_owned(),
                "im-server.2026-03-01-02.log".to_owned()
            ]
        );
        assert_eq!(
            states(dir.path()),
            vec![
                (
                    "im-server.2026-03-01-01.log.zst".into(),
                    FileState::Compressed
                ),
                (
                    "im-server.2026-03-01-02.log.zst".into(),
                    FileState::Compressed
                ),
                ("im-server.2026-03-01-03.log".into(), FileState::Active),
            ]
        );
        let packed = fs::read(dir.path().join("im-server.2026-03-01-01.log.zst")).unwrap();
        assert!(packed.len() < original.len() / 5);
        assert_eq!(zstd::stream::decode_all(&packed[..]).unwrap(), original);
        assert_eq!(
            c.stats.compressed.load(Ordering::Relaxed),
            original.len() as u64 + 7
        );
        assert!(dir.path().join("other.txt").exists());
    }

    #[test]
    fn compresses_when_idle_long_enough_and_deletes_past_retention() {
        let rate = Arc::new(Mutex::new(0.2));
        let (dir, clock, mut c, _) = setup(rate.clone());
        // Quiet, but not for 10 minutes yet.
        assert!(!c.tick().allowed);
        *clock.0.lock().unwrap() = at("2026-03-01T12:05:00+00:00");
        assert!(!c.tick().allowed);
        // Traffic resets the idle clock.
        *rate.lock().unwrap() = 50.0;
        *clock.0.lock().unwrap() = at("2026-03-01T12:09:00+00:00");
        assert!(!c.tick().allowed);
        *rate.lock().unwrap() = 0.0;
        *clock.0.lock().unwrap() = at("2026-03-01T12:10:00+00:00");
        assert!(!c.tick().allowed);
        *clock.0.lock().unwrap() = at("2026-03-01T12:20:00+00:00");
        let r = c.tick();
        assert!(r.allowed && r.compressed.len() == 2, "{r:?}");
        // Three days on: all but the active file are past the 48 h retention.
        *clock.0.lock().unwrap() = at("2026-03-04T12:00:00+00:00");
        let r = c.tick();
        assert_eq!(r.deleted.len(), 2, "{r:?}");
        assert_eq!(
            states(dir.path()),
            vec![("im-server.2026-03-01-03.log".into(), FileState::Active)]
        );
    }

    #[test]
    fn a_window_that_closes_mid_file_leaves_the_original() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("im-server.x.log");
        fs::write(&src, vec![b'a'; 3 * CHUNK]).unwrap();
        let mut calls = 0;
        let r = compress_file(&src, 3, 1.0, &mut || {
            calls += 1;
            calls < 2
        })
        .unwrap();
        assert_eq!(r, None);
        assert!(src.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
