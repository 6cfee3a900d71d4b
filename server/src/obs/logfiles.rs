//! Log outputs: the process's `tracing` subscriber. Owns
//! [`init`], which installs human text on stderr (values escaped, `textlog`) plus JSON lines into rolling files
//! (`tracing-appender`, written by a non-blocking worker thread whose bytes are counted),
//! both behind one [`DiagFilter`] together with the live tail's ring (`tail`), and the
//! process-wide [`LogControl`] that the admin API and the compactor use.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use super::compactor::{LogStats, Window};
use super::logfilter::{DiagFilter, LevelSpec, LogFilters};
use super::tail::{Tail, TailLayer, SUBSCRIBER_QUEUE};
use super::textlog::EscapedFields;

/// What [`init`] needs: the `[log]` settings that shape the outputs, with the file
/// directory resolved (the config builds it: `LogConfig::options`).
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Global level spec (`log.level`).
    pub level: String,
    /// Per-uid filters on (`log.uid_filters`).
    pub uid_filters: bool,
    /// Most per-uid filters at once (`log.max_uid_filters`).
    pub max_uid_filters: usize,
    /// Events the live tail's ring keeps (`log.tail_ring_events`).
    pub tail_ring_events: usize,
    /// Most live tails at once (`log.max_tails`).
    pub max_tails: usize,
    /// Directory of the JSON files; `None` when `log.files = false`.
    pub dir: Option<PathBuf>,
    /// File name prefix (`log.prefix`).
    pub prefix: String,
    /// `minutely`, `hourly`, `daily` or `never` (`log.rotation`; anything else: hourly).
    pub rotation: String,
    /// Drop lines rather than block when the file writer falls behind (`log.lossy`).
    pub lossy: bool,
    /// Lines buffered for the file writer (`log.buffered_lines`).
    pub buffered_lines: usize,
    /// Off-peak window start, `HH:MM` (`log.window_start`).
    pub window_start: String,
    /// Off-peak window end, `HH:MM` (`log.window_end`).
    pub window_end: String,
    /// Retention in hours (`log.retention_hours`).
    pub retention_hours: u32,
}

/// Errors from setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum LogInitError {
    /// `log.level` does not parse.
    #[error("config key `log.level` = {value:?}: {message}")]
    Level {
        /// The value.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// The log directory cannot be created or opened.
    #[error("log directory {dir}: {message}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// `log.window_start` or `log.window_end` does not parse.
    #[error("{0}")]
    Window(String),
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    Installed(String),
}

/// What the admin API and the compactor need from the installed logging.
pub struct LogControl {
    /// Global level and per-uid filters.
    pub filters: Arc<LogFilters>,
    /// The live tail's ring and subscribers.
    pub tail: Arc<Tail>,
    /// The log directory (None when `log.files = false`).
    pub dir: Option<PathBuf>,
    /// File name prefix.
    pub prefix: String,
    /// File and compaction totals.
    pub stats: Arc<LogStats>,
    /// The off-peak window.
    pub window: Window,
    /// Retention, hours.
    pub retention_hours: u32,
    dropped: Option<ErrorCounter>,
}

impl LogControl {
    /// Lines the non-blocking file writer dropped because it fell behind.
    pub fn dropped_lines(&self) -> u64 {
        self.dropped
            .as_ref()
            .map_or(0, |c| c.dropped_lines() as u64)
    }
}

static CONTROL: OnceLock<Arc<LogControl>> = OnceLock::new();

/// The installed logging, if [`init`] ran in this process.
pub fn control() -> Option<Arc<LogControl>> {
    CONTROL.get().cloned()
}

/// Keeps the file writer's worker alive; dropping it flushes what is queued.
pub struct LogGuard {
    _worker: Option<WorkerGuard>,
}

/// Counts the bytes the file writer writes (`im_log_bytes_written_total`).
struct CountingWriter<W> {
    inner: W,
    stats: Arc<LogStats>,
    counter: metrics::Counter,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.stats.written.fetch_add(n as u64, Ordering::Relaxed);
        self.counter.increment(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Installs the process's subscriber from `lc`: text to stderr (as before), JSON lines
/// to `<log dir>/<prefix>.<period>.log`, the level and per-uid filters from
/// [`LogFilters`]. Call once, before anything logs; keep the guard until exit.
pub fn init(lc: &LogOptions) -> Result<LogGuard, LogInitError> {
    // Metric handles taken below must see the recorder.
    let _ = super::install_recorder();
    metrics::describe_counter!(
        "im_log_lines_dropped_total",
        "Log lines the non-blocking file writer dropped because it fell behind."
    );
    let spec = LevelSpec::parse(&lc.level).map_err(|message| LogInitError::Level {
        value: lc.level.clone(),
        message,
    })?;
    let filters = LogFilters::new(spec, lc.uid_filters, lc.max_uid_filters);
    filters.install();
    let tail = Tail::new(
        filters.clone(),
        lc.tail_ring_events,
        lc.max_tails,
        SUBSCRIBER_QUEUE,
    );
    let stats = Arc::new(LogStats::default());
    let stderr = tracing_subscriber::fmt::layer()
        .fmt_fields(EscapedFields)
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()));

    let (file_layer, worker, dropped, dir) = if let Some(dir) = lc.dir.clone() {
        let dir_err = |e: &dyn std::fmt::Display| LogInitError::Dir {
            dir: dir.clone(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(&dir).map_err(|e| dir_err(&e))?;
        let rotation = match lc.rotation.as_str() {
            "minutely" => Rotation::MINUTELY,
            "daily" => Rotation::DAILY,
            "never" => Rotation::NEVER,
            _ => Rotation::HOURLY,
        };
        let appender = RollingFileAppender::builder()
            .rotation(rotation)
            .filename_prefix(lc.prefix.as_str())
            .filename_suffix("log")
            .build(&dir)
            .map_err(|e| dir_err(&e))?;
        let counting = CountingWriter {
            inner: appender,
            stats: stats.clone(),
            counter: metrics::counter!("im_log_bytes_written_total"),
        };
        let (writer, worker) = NonBlockingBuilder::default()
            .lossy(lc.lossy)
            .buffered_lines_limit(lc.buffered_lines)
            .thread_name("im-log-writer")
            .finish(counting);
        let dropped = writer.error_counter();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer);
        (Some(layer), Some(worker), Some(dropped), Some(dir))
    } else {
        (None, None, None, None)
    };

    tracing_subscriber::registry()
        .with(
            stderr
                .and_then(file_layer)
                .and_then(TailLayer::new(tail.clone()))
                .with_filter(DiagFilter::new(filters.clone())),
        )
        .try_init()
        .map_err(|e| LogInitError::Installed(e.to_string()))?;
    super::logfilter::sync_log_max_level();

    let window = Window::parse(&lc.window_start, &lc.window_end).map_err(LogInitError::Window)?;
    let _ = CONTROL.set(Arc::new(LogControl {
        filters,
        tail,
        dir,
        prefix: lc.prefix.clone(),
        stats,
        window,
        retention_hours: lc.retention_hours,
        dropped,
    }));
    Ok(LogGuard { _worker: worker })
}
