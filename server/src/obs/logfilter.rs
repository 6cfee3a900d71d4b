//! Log filtering: the global level (reloadable at runtime) and per-uid overrides with a
//! TTL. Owns [`LogFilters`] (the shared state the admin API
//! changes), [`DiagFilter`] (the `tracing_subscriber` per-layer filter that reads it) and
//! the connection scope ([`in_conn`]): one `conn` span per connection whose `uid` is
//! recorded once, at login ([`set_conn_uid`]). The span is made only when an event could
//! first come out with it (as below), so a connection that never logs holds none.
//!
//! Cost model. With no uid filter set, every callsite's interest is `always` or `never`
//! from the global level and the max level stays at it, so a disabled `debug!` costs the
//! `tracing` macro's one relaxed load. A connection's futures run inside [`InConn`],
//! which on each poll publishes the connection (one thread-local write and restore) and
//! enters the `conn` span only while that uid has a filter (or the global level is above
//! `info`), so an unfiltered connection pays no span enter/exit. While any filter is set,
//! callsites a filter could change become `sometimes`; each such event reads the
//! thread-local connection and one relaxed load of its uid's level slot: no global lock,
//! no map lookup, nothing put or removed per message. Changes call
//! `tracing::callsite::rebuild_interest_cache()`.
//!
//! Attribution. Tasks shared by every user (the persistence writer, the router) emit
//! one user's events with [`as_uid`]: [`filtered_uids`] says (one relaxed load when no
//! filter is set) whether any uid is filtered and at what level, and inside `as_uid`
//! the event passes this filter at that uid's level, as if it ran on its connection.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata, Span};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Filter};

/// Target of the connection span.
pub const CONN_TARGET: &str = "im_server::conn";
/// Name of the connection span.
pub const CONN_SPAN: &str = "conn";
/// Levels a per-uid filter may take.
pub const UID_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];

/// The filters connections register with (set once by [`LogFilters::install`]).
static CONN_FILTERS: OnceLock<Arc<LogFilters>> = OnceLock::new();

/// One connection's handling: its span (made when first needed) and, after login, its
/// uid's level slot.
struct ConnCell {
    /// The `conn` span, made the first time an event could come out with it
    /// ([`ConnCell::wants_span`]): each log layer keeps formatted fields per span, and
    /// most connections never log under theirs.
    span: OnceLock<Span>,
    /// Held while the span is made and while the uid is recorded, so that whichever
    /// comes first the span ends up with the uid.
    making: Mutex<()>,
    conn_id: u64,
    slot: OnceLock<Arc<UidSlot>>,
    /// The logged-in user, once known.
    uid: OnceLock<Arc<str>>,
    filters: Arc<LogFilters>,
}

impl ConnCell {
    fn new(filters: &Arc<LogFilters>, conn_id: u64) -> Arc<ConnCell> {
        Arc::new(ConnCell {
            span: OnceLock::new(),
            making: Mutex::new(()),
            conn_id,
            slot: OnceLock::new(),
            uid: OnceLock::new(),
            filters: filters.clone(),
        })
    }

    /// The connection's span, made now if it is not yet (with the uid, once known).
    fn span(&self) -> &Span {
        if let Some(span) = self.span.get() {
            return span;
        }
        let _making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        self.span.get_or_init(|| {
            // ERROR-level so that it exists whatever the global level.
            let span = tracing::error_span!(
                target: CONN_TARGET,
                CONN_SPAN,
                conn_id = self.conn_id,
                uid = tracing::field::Empty
            );
            if let Some(uid) = self.uid.get() {
                span.record("uid", &**uid);
            }
            span
        })
    }

    /// The uid's filter level (rank), if it has one.
    fn level(&self) -> Option<u8> {
        let l = self.slot.get()?.level.load(Ordering::Relaxed);
        (l != 0).then_some(l)
    }

    /// Enter the span for this poll: only when an event could come out with it.
    fn wants_span(&self) -> bool {
        self.level().is_some() || self.filters.verbose.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The connection whose future is being polled on this thread (null: none).
    static CURRENT: Cell<*const ConnCell> = const { Cell::new(std::ptr::null()) };
    /// The user the events emitted now are attributed to, with its filter level
    /// ([`as_uid`]); `None` outside.
    static ATTRIBUTED: RefCell<Option<(Arc<str>, u8)>> = const { RefCell::new(None) };
}

/// Runs `f` with its events attributed to `uid` at filter `level` (a rank, as in
/// [`filtered_uids`]): they pass the log filter at that level and the live tail files
/// them under `uid`. For the shared tasks (writer, router) that emit one user's events.
pub fn as_uid<R>(uid: &Arc<str>, level: u8, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<(Arc<str>, u8)>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let prev = self.0.take();
            ATTRIBUTED.with(|a| *a.borrow_mut() = prev);
        }
    }
    let prev = ATTRIBUTED.with(|a| a.borrow_mut().replace((uid.clone(), level)));
    let _reset = Reset(prev);
    f()
}

/// The attributed level, if an [`as_uid`] scope is open on this thread.
fn attributed_level() -> Option<u8> {
    ATTRIBUTED.with(|a| a.borrow().as_ref().map(|(_, l)| *l))
}

/// The uids under a filter, with their levels (ranks: 1 error to 5 trace); `None`, for
/// the cost of one relaxed load, while no filter is set (or logging is not managed).
pub fn filtered_uids() -> Option<Arc<HashMap<Arc<str>, u8>>> {
    let f = CONN_FILTERS.get()?;
    if !f.any.load(Ordering::Relaxed) {
        return None;
    }
    Some(f.levels())
}

/// The user of the open [`as_uid`] scope on this thread, with its level.
pub(crate) fn attributed_uid() -> Option<(Arc<str>, u8)> {
    ATTRIBUTED.with(|a| a.borrow().clone())
}

/// The user of the connection being polled on this thread, with its level, if its uid
/// has a filter.
pub(crate) fn conn_uid() -> Option<(Arc<str>, u8)> {
    with_current(|c| {
        let l = c.level()?;
        Some((c.uid.get()?.clone(), l))
    })
    .flatten()
}

/// Restores the previous current connection, also when a poll panics.
struct Restore(*const ConnCell);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Runs `f` with the connection being polled on this thread, if any.
fn with_current<R>(f: impl FnOnce(&ConnCell) -> R) -> Option<R> {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: `CURRENT` is non-null only inside `InConn::poll`, which holds an `Arc` to
    // the cell for the whole poll and restores the previous value before returning.
    (!p.is_null()).then(|| f(unsafe { &*p }))
}

/// A future that is part of one connection's handling (see [`in_conn`]).
pub struct InConn<F> {
    cell: Option<Arc<ConnCell>>,
    fut: Pin<Box<F>>,
}

impl<F: Future> Future for InConn<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let Some(cell) = &this.cell else {
            return this.fut.as_mut().poll(cx);
        };
        let _restore = Restore(CURRENT.with(|c| c.replace(Arc::as_ptr(cell))));
        if cell.wants_span() {
            let _entered = cell.span().enter();
            this.fut.as_mut().poll(cx)
        } else {
            this.fut.as_mut().poll(cx)
        }
    }
}

/// Runs `fut` as the handling of a new connection `conn_id`: its events can be raised to
/// a per-uid level once [`set_conn_uid`] has run inside it. With `log.uid_filters =
/// false` (or no managed logging) it is a plain boxed future.
pub fn in_conn<F: Future>(conn_id: u64, fut: F) -> InConn<F> {
    InConn {
        cell: CONN_FILTERS
            .get()
            .filter(|f| f.uid_enabled)
            .map(|f| ConnCell::new(f, conn_id)),
        fut: Box::pin(fut),
    }
}

/// Runs `fut` (e.g. a spawned write loop) as part of the connection being polled now.
pub fn in_current_conn<F: Future>(fut: F) -> InConn<F> {
    let p = CURRENT.with(|c| c.get());
    let cell = (!p.is_null()).then(|| {
        // SAFETY: as in `with_current`, `p` comes from a live `Arc` held by the `InConn`
        // being polled; taking one more strong count keeps it alive for this future.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    });
    InConn {
        cell,
        fut: Box::pin(fut),
    }
}

/// Attaches the logged-in user to the connection being polled, once: records `uid` on
/// its span and binds the uid's filter slot.
pub fn set_conn_uid(uid: &str) {
    with_current(|c| {
        {
            let _making = c.making.lock().unwrap_or_else(|e| e.into_inner());
            let _ = c.uid.set(Arc::from(uid));
            if let Some(span) = c.span.get() {
                span.record("uid", uid);
            }
        }
        let _ = c.slot.set(c.filters.slot_for(uid));
    });
}

/// Rank of an event level: 1 (error) to 5 (trace).
pub(crate) fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

fn rank_filter(r: u8) -> LevelFilter {
    match r {
        0 => LevelFilter::OFF,
        1 => LevelFilter::ERROR,
        2 => LevelFilter::WARN,
        3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

fn parse_level(s: &str) -> Option<LevelFilter> {
    match s.trim().to_ascii_lowercase().as_str() {
        "off" => Some(LevelFilter::OFF),
        "error" => Some(LevelFilter::ERROR),
        "warn" | "warning" => Some(LevelFilter::WARN),
        "info" => Some(LevelFilter::INFO),
        "debug" => Some(LevelFilter::DEBUG),
        "trace" => Some(LevelFilter::TRACE),
        _ => None,
    }
}

/// A parsed global level: `LEVEL` and/or `target=LEVEL` directives, comma-separated
/// (e.g. `info,im_server::store=debug,sqlx=warn`). The longest matching target prefix
/// wins; the bare level (default `info`) applies to everything else. Matching is
/// `tracing_subscriber`'s [`Targets`] (parsed with its `FromStr` from the checked,
/// canonical directives); the check before it gives the errors that name the directive
/// at fault and say what would do.
#[derive(Debug, Clone)]
pub struct LevelSpec {
    text: String,
    targets: Targets,
}

impl LevelSpec {
    /// Parses a spec; the error names the directive at fault.
    pub fn parse(text: &str) -> Result<LevelSpec, String> {
        let mut default = None;
        let mut targets: Vec<(&str, LevelFilter)> = Vec::new();
        for d in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match d.split_once('=') {
                None => {
                    let l = parse_level(d).ok_or_else(|| {
                        format!("{d:?} is not a level (use trace, debug, info, warn, error or off, or target=level)")
                    })?;
                    default = Some(l);
                }
                Some((target, level)) => {
                    let target = target.trim();
                    let valid = !target.is_empty()
                        && target.chars().all(|c| {
                            c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.')
                        });
                    if !valid {
                        return Err(format!("{d:?}: {target:?} is not a target (use a module path like im_server::store)"));
                    }
                    let l = parse_level(level).ok_or_else(|| {
                        format!("{d:?}: {level:?} is not a level (use trace, debug, info, warn, error or off)")
                    })?;
                    targets.retain(|(t, _)| *t != target);
                    targets.push((target, l));
                }
            }
        }
        if default.is_none() && targets.is_empty() {
            return Err("empty level (use e.g. info or info,im_server=debug)".into());
        }
        // The same spec in `Targets`' own syntax: one default first (a spec without a
        // bare level means info), then each target once with its last level.
        let canonical: Vec<String> =
            std::iter::once(default.unwrap_or(LevelFilter::INFO).to_string())
                .chain(targets.iter().map(|(t, l)| format!("{t}={l}")))
                .collect();
        let targets = canonical
            .join(",")
            .parse::<Targets>()
            .map_err(|e| format!("{:?}: {e}", text.trim()))?;
        Ok(LevelSpec {
            text: text.trim().to_owned(),
            targets,
        })
    }

    /// The spec as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The level for a target: the most verbose one it enables.
    pub fn level_for(&self, target: &str) -> LevelFilter {
        [
            Level::TRACE,
            Level::DEBUG,
            Level::INFO,
            Level::WARN,
            Level::ERROR,
        ]
        .into_iter()
        .find(|l| self.targets.would_enable(target, l))
        .map_or(LevelFilter::OFF, LevelFilter::from_level)
    }

    /// Whether an event at `level` from `target` passes.
    pub fn enabled(&self, target: &str, level: &Level) -> bool {
        self.targets.would_enable(target, level)
    }

    /// The most verbose level any directive enables.
    pub fn max(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| l)
            .chain(self.targets.default_level())
            .max()
            .unwrap_or(LevelFilter::OFF)
    }
}

/// Errors from changing filters through the admin API.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The filter table is full.
    #[error("too many log filters (log.max_uid_filters = {0})")]
    TooMany(usize),
    /// Per-uid filters are switched off.
    #[error("per-uid log filters are disabled (log.uid_filters = false)")]
    Disabled,
}

/// The level slot of one uid, shared by that uid's connection spans and its filter.
#[derive(Default)]
struct UidSlot {
    /// 0: no filter; 1 (error) to 5 (trace).
    level: AtomicU8,
}

struct Entry {
    level: u8,
    ttl_secs: u64,
    expires: Instant,
    slot: Arc<UidSlot>,
}

#[derive(Default)]
struct Table {
    filters: HashMap<Arc<str>, Entry>,
    /// Every uid with a live span or filter; weak so closed connections free theirs.
    slots: HashMap<Arc<str>, Weak<UidSlot>>,
    /// `slots` length after the last prune.
    pruned_len: usize,
}

/// One per-uid filter as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct FilterInfo {
    /// The user id.
    pub uid: String,
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
    /// The TTL it was set with.
    pub ttl_secs: u64,
    /// Seconds until it expires.
    pub remaining_secs: f64,
}

/// The name of a level rank (`error` .. `trace`).
pub(crate) fn level_name(r: u8) -> &'static str {
    match r {
        1 => "error",
        2 => "warn",
        3 => "info",
        4 => "debug",
        _ => "trace",
    }
}

/// Parses a per-uid filter level (one of [`UID_LEVELS`]).
pub fn parse_uid_level(s: &str) -> Option<u8> {
    match s {
        "error" => Some(1),
        "warn" => Some(2),
        "info" => Some(3),
        "debug" => Some(4),
        "trace" => Some(5),
        _ => None,
    }
}

/// The filter state: global level plus per-uid overrides. Shared by the subscriber's
/// [`DiagFilter`] and the admin API.
pub struct LogFilters {
    global: RwLock<Arc<LevelSpec>>,
    /// Any uid filter set: the one flag the no-filter path depends on.
    any: AtomicBool,
    /// Most and least verbose uid filter level (ranks), valid while `any`.
    uid_max: AtomicU8,
    uid_min: AtomicU8,
    table: Mutex<Table>,
    /// The filtered uids and their levels, rebuilt at every change (read by
    /// [`filtered_uids`] and the live tail without taking the table's lock).
    levels: RwLock<Arc<HashMap<Arc<str>, u8>>>,
    uid_enabled: bool,
    max_filters: usize,
    /// The global level is above `info`: connections enter their span on every poll.
    verbose: AtomicBool,
}

impl LogFilters {
    /// New state with `global` in force and no uid filter; `uid_enabled` switches the
    /// connection span (and so per-uid filtering) on.
    pub fn new(global: LevelSpec, uid_enabled: bool, max_filters: usize) -> Arc<Self> {
        Arc::new(LogFilters {
            verbose: AtomicBool::new(global.max() > LevelFilter::INFO),
            global: RwLock::new(Arc::new(global)),
            any: AtomicBool::new(false),
            uid_max: AtomicU8::new(0),
            uid_min: AtomicU8::new(0),
            table: Mutex::new(Table::default()),
            levels: RwLock::new(Arc::new(HashMap::new())),
            uid_enabled,
            max_filters,
        })
    }

    /// Makes these the filters new connections register with (once per process).
    pub fn install(self: &Arc<Self>) {
        let _ = CONN_FILTERS.set(self.clone());
    }

    fn global(&self) -> Arc<LevelSpec> {
        match self.global.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The filtered uids and their levels (ranks).
    pub fn levels(&self) -> Arc<HashMap<Arc<str>, u8>> {
        match self.levels.read() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether any uid filter is set (one relaxed load).
    pub fn any_filter(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The filter level (rank) of `uid`, if it has a filter.
    pub fn level_of(&self, uid: &str) -> Option<u8> {
        if !self.any_filter() {
            return None;
        }
        self.levels().get(uid).copied()
    }

    /// The global level spec in force.
    pub fn global_level(&self) -> String {
        self.global().as_str().to_owned()
    }

    /// Replaces the global level at runtime; the error says what does not parse.
    pub fn set_global_level(&self, text: &str) -> Result<String, String> {
        let spec = LevelSpec::parse(text)?;
        let shown = spec.as_str().to_owned();
        self.verbose
            .store(spec.max() > LevelFilter::INFO, Ordering::Relaxed);
        match self.global.write() {
            Ok(mut g) => *g = Arc::new(spec),
            Err(p) => *p.into_inner() = Arc::new(spec),
        }
        rebuild();
        Ok(shown)
    }

    /// Whether per-uid filtering is on (`log.uid_filters`).
    pub fn uid_enabled(&self) -> bool {
        self.uid_enabled
    }

    /// Sets (or replaces) the filter for `uid`: its events come out at `level` (a rank
    /// from [`parse_uid_level`]) for `ttl`.
    pub fn set(&self, uid: &str, level: u8, ttl: Duration) -> Result<FilterInfo, FilterError> {
        if !self.uid_enabled {
            return Err(FilterError::Disabled);
        }
        let mut t = self.table();
        if !t.filters.contains_key(uid) && t.filters.len() >= self.max_filters {
            return Err(FilterError::TooMany(self.max_filters));
        }
        let key: Arc<str> = Arc::from(uid);
        let slot = slot_in(&mut t, &key);
        slot.level.store(level, Ordering::Relaxed);
        let expires = Instant::now() + ttl;
        t.filters.insert(
            key,
            Entry {
                level,
                ttl_secs: ttl.as_secs(),
                expires,
                slot,
            },
        );
        let changed = self.summarize(&t);
        drop(t);
        if changed {
            rebuild();
        }
        Ok(FilterInfo {
            uid: uid.to_owned(),
            level: level_name(level),
            ttl_secs: ttl.as_secs(),
            remaining_secs: ttl.as_secs_f64(),
        })
    }

    /// Removes the filter for `uid`; false if there was none.
    pub fn remove(&self, uid: &str) -> bool {
        let mut t = self.table();
        let Some(e) = t.filters.remove(uid) else {
            return false;
        };
        e.slot.level.store(0, Ordering::Relaxed);
        let changed = self.summarize(&t);
        drop(t);
        if changed {
            rebuild();
        }
        true
    }

    /// Drops expired filters (called a few times a second and before listing).
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut t = self.table();
        let before = t.filters.len();
        t.filters.retain(|_, e| {
            let keep = e.expires > now;
            if !keep {
                e.slot.level.store(0, Ordering::Relaxed);
            }
            keep
        });
        if t.filters.len() == before {
            return;
        }
        let changed = self.summarize(&t);
        drop(t);
        if changed {
            rebuild();
        }
    }

    /// The filters in force, by uid.
    pub fn list(&self) -> Vec<FilterInfo> {
        self.sweep();
        let now = Instant::now();
        let t = self.table();
        let mut v: Vec<FilterInfo> = t
            .filters
            .iter()
            .map(|(uid, e)| FilterInfo {
                uid: uid.to_string(),
                level: level_name(e.level),
                ttl_secs: e.ttl_secs,
                remaining_secs: (e.expires.saturating_duration_since(now).as_secs_f64() * 10.0)
                    .round()
                    / 10.0,
            })
            .collect();
        v.sort_by(|a, b| a.uid.cmp(&b.uid));
        v
    }

    /// Number of filters in force.
    pub fn active(&self) -> usize {
        self.table().filters.len()
    }

    /// Recomputes the flag and level bounds after a change; true if the callsite
    /// interest must be rebuilt. Sets `im_log_filters_active`.
    fn summarize(&self, t: &Table) -> bool {
        let n = t.filters.len();
        metrics::gauge!("im_log_filters_active").set(n as f64);
        let levels: HashMap<Arc<str>, u8> = t
            .filters
            .iter()
            .map(|(k, e)| (k.clone(), e.level))
            .collect();
        match self.levels.write() {
            Ok(mut l) => *l = Arc::new(levels),
            Err(p) => *p.into_inner() = Arc::new(levels),
        }
        let (max, min) = t
            .filters
            .values()
            .fold((0u8, 5u8), |(mx, mn), e| (mx.max(e.level), mn.min(e.level)));
        let any = n > 0;
        let was_any = self.any.swap(any, Ordering::Relaxed);
        let old_max = self
            .uid_max
            .swap(if any { max } else { 0 }, Ordering::Relaxed);
        let old_min = self
            .uid_min
            .swap(if any { min } else { 0 }, Ordering::Relaxed);
        was_any != any || (any && (old_max != max || old_min != min))
    }

    /// The level slot for a uid seen on a connection span.
    fn slot_for(&self, uid: &str) -> Arc<UidSlot> {
        let mut t = self.table();
        let key: Arc<str> = Arc::from(uid);
        slot_in(&mut t, &key)
    }

    fn callsite(&self, meta: &Metadata<'_>) -> Interest {
        if is_conn_span(meta) {
            return Interest::always();
        }
        if dumps_payloads(meta) {
            return Interest::never();
        }
        let global = self.global().enabled(meta.target(), meta.level());
        if !self.any.load(Ordering::Relaxed) {
            return if global {
                Interest::always()
            } else {
                Interest::never()
            };
        }
        let r = rank(meta.level());
        if global && r <= self.uid_min.load(Ordering::Relaxed) {
            // No uid filter is quieter than this: it always passes.
            Interest::always()
        } else if global || r <= self.uid_max.load(Ordering::Relaxed) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_hint(&self) -> LevelFilter {
        let mut m = self.global().max();
        if self.uid_enabled {
            // The connection span is ERROR-level: it must pass the max-level check.
            m = m.max(LevelFilter::ERROR);
        }
        if self.any.load(Ordering::Relaxed) {
            m = m.max(rank_filter(self.uid_max.load(Ordering::Relaxed)));
        }
        m
    }
}

/// Finds or creates the slot for `key`, pruning dead slots now and then.
fn slot_in(t: &mut Table, key: &Arc<str>) -> Arc<UidSlot> {
    if let Some(s) = t.slots.get(key).and_then(Weak::upgrade) {
        return s;
    }
    let s = Arc::new(UidSlot::default());
    if let Some(e) = t.filters.get(key) {
        // A filter without live spans keeps its slot alive: reuse it.
        t.slots.insert(key.clone(), Arc::downgrade(&e.slot));
        return e.slot.clone();
    }
    t.slots.insert(key.clone(), Arc::downgrade(&s));
    if t.slots.len() > 2 * t.pruned_len + 1024 {
        t.slots.retain(|_, w| w.strong_count() > 0);
        t.pruned_len = t.slots.len();
    }
    s
}

/// Recomputes every callsite's interest and the max level, and tells the `log` crate.
fn rebuild() {
    tracing::callsite::rebuild_interest_cache();
    log::set_max_level(match LevelFilter::current().into_level() {
        None => log::LevelFilter::Off,
        Some(Level::ERROR) => log::LevelFilter::Error,
        Some(Level::WARN) => log::LevelFilter::Warn,
        Some(Level::INFO) => log::LevelFilter::Info,
        Some(Level::DEBUG) => log::LevelFilter::Debug,
        Some(Level::TRACE) => log::LevelFilter::Trace,
    });
}

/// Syncs the `log` crate's max level with tracing's (call once after installing).
pub fn sync_log_max_level() {
    rebuild();
}

fn is_conn_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == CONN_SPAN && meta.target() == CONN_TARGET
}

/// The per-layer filter of the log outputs: the global level, overridden inside a
/// connection span whose uid has a filter.
#[derive(Clone)]
pub struct DiagFilter {
    filters: Arc<LogFilters>,
}

impl DiagFilter {
    /// A filter reading `filters`.
    pub fn new(filters: Arc<LogFilters>) -> Self {
        DiagFilter { filters }
    }
}

/// Crates whose TRACE events print raw frames (the WebSocket library logs every message
/// it receives, Login tokens and private message text included). They stay off at any
/// level, per-uid filters too: secrets and payloads never reach the logs.
const PAYLOAD_DUMPING_TARGETS: &[&str] = &["tungstenite", "tokio_tungstenite", "async_nats"];

fn dumps_payloads(meta: &Metadata<'_>) -> bool {
    *meta.level() == Level::TRACE
        && PAYLOAD_DUMPING_TARGETS.iter().any(|t| {
            meta.target()
                .strip_prefix(t)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

impl<S: tracing::Subscriber> Filter<S> for DiagFilter {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        if is_conn_span(meta) {
            return true;
        }
        if dumps_payloads(meta) {
            return false;
        }
        if self.filters.any.load(Ordering::Relaxed) {
            if let Some(l) = attributed_level() {
                return rank(meta.level()) <= l;
            }
            if let Some(Some(l)) = with_current(ConnCell::level) {
                return rank(meta.level()) <= l;
            }
        }
        self.filters.global().enabled(meta.target(), meta.level())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        self.filters.callsite(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.filters.max_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot-path cost per message of the per-uid machinery, in-process and precise
    /// where end-to-end throughput on a shared machine is not. Per message: four polls
    /// of a connection future (read loop, write loop, the receiver's write loop, one
    /// spare), one debug event and the writer's and router's two looks at the filter
    /// set, with both outputs and the live tail's layer installed (writing to a sink).
    /// `cargo test --release -p im-server --lib hot_path_cost -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn hot_path_cost() {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;

        /// Polled forever; every fifth poll emits the message's debug event, and asks
        /// the filter set twice, as the writer and the router do for each message.
        struct Conn(u64, u64, Arc<LogFilters>);
        impl Future for Conn {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<()> {
                self.1 += 1;
                if self.1 == 5 {
                    self.1 = 0;
                    self.0 += 1;
                    for _ in 0..2 {
                        // `filtered_uids`, on this run's filters.
                        if self.2.any_filter() {
                            std::hint::black_box(self.2.levels());
                        }
                    }
                    tracing::debug!(
                        req_id = self.0,
                        bytes = 100usize,
                        group = false,
                        "send accepted"
                    );
                }
                Poll::Pending
            }
        }

        let run = |uid_enabled: bool, filters: usize, own: bool| -> f64 {
            let f = LogFilters::new(LevelSpec::parse("info").unwrap(), uid_enabled, 100_000);
            for i in 0..filters {
                f.set(&format!("other{i}"), 4, Duration::from_secs(600))
                    .unwrap();
            }
            if own {
                f.set("s1", 4, Duration::from_secs(600)).unwrap();
            }
            let sub = tracing_subscriber::registry().with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(super::super::textlog::EscapedFields)
                    .with_writer(std::io::sink)
                    .and_then(
                        tracing_subscriber::fmt::layer()
                            .json()
                            .with_current_span(true)
                            .with_writer(std::io::sink),
                    )
                    .and_then(super::super::tail::TailLayer::new(
                        super::super::tail::Tail::new(f.clone(), 4096, 8, 1024),
                    ))
                    .with_filter(DiagFilter::new(f.clone())),
            );
            let _g = tracing::subscriber::set_default(sub);
            rebuild();
            let mut conn = InConn {
                cell: uid_enabled.then(|| ConnCell::new(&f, 7)),
                fut: Box::pin(Conn(0, 0, f.clone())),
            };
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            let mut login = InConn {
                cell: conn.cell.clone(),
                fut: Box::pin(std::future::poll_fn(|_| {
                    set_conn_uid("s1");
                    Poll::Ready(())
                })),
            };
            let _ = Pin::new(&mut login).poll(&mut cx);
            let n = 1_000_000u64;
            let t = Instant::now();
            for _ in 0..5 * n {
                let _ = Pin::new(&mut conn).poll(&mut cx);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        for round in 0..3 {
            let plain = run(false, 0, false);
            let nofilter = run(true, 0, false);
            let filters = run(true, 1000, false);
            let own = run(true, 0, true);
            println!(
                "round {round}: ns per message: plain {plain:.1}, nofilter {nofilter:.1} \
                 (+{:.1}), 1000 filters on others {filters:.1} (+{:.1}); \
                 this uid filtered at debug (events formatted to a sink) {own:.1}",
                nofilter - plain,
                filters - plain
            );
        }
    }

    #[test]
    fn level_specs_parse_strictly() {
        let s = LevelSpec::parse("info,im_server::store=debug,sqlx=warn").unwrap();
        assert_eq!(s.level_for("im_server::store::sqlite"), LevelFilter::DEBUG);
        assert_eq!(s.level_for("im_server::gateway"), LevelFilter::INFO);
        assert_eq!(s.level_for("sqlx::query"), LevelFilter::WARN);
        assert_eq!(s.max(), LevelFilter::DEBUG);
        assert!(s.enabled("im_server", &Level::INFO));
        assert!(!s.enabled("im_server", &Level::DEBUG));
        assert_eq!(LevelSpec::parse("debug").unwrap().max(), LevelFilter::DEBUG);
        for bad in ["", "lots", "info,x=loud", "=debug", "a b=info"] {
            assert!(LevelSpec::parse(bad).is_err(), "{bad}");
        }
        // No bare level: info for the rest; a target named twice keeps its last level;
        // `warning` and any case are levels.
        let s = LevelSpec::parse(" im_server=debug , sqlx=WARNING,sqlx=error").unwrap();
        assert_eq!(s.as_str(), "im_server=debug , sqlx=WARNING,sqlx=error");
        assert_eq!(s.level_for("tokio"), LevelFilter::INFO);
        assert_eq!(s.level_for("sqlx"), LevelFilter::ERROR);
        assert_eq!(s.level_for("im_server::gateway"), LevelFilter::DEBUG);
        assert_eq!(LevelSpec::parse("off").unwrap().max(), LevelFilter::OFF);
        assert_eq!(
            LevelSpec::parse("info,x=loud").unwrap_err(),
            r#""x=loud": "loud" is not a level (use trace, debug, info, warn, error or off)"#
        );
        assert_eq!(
            LevelSpec::parse("lots").unwrap_err(),
            r#""lots" is not a level (use trace, debug, info, warn, error or off, or target=level)"#
        );
        assert_eq!(
            LevelSpec::parse("a b=info").unwrap_err(),
            r#""a b=info": "a b" is not a target (use a module path like im_server::store)"#
        );
        assert_eq!(
            LevelSpec::parse(" , ").unwrap_err(),
            "empty level (use e.g. info or info,im_server=debug)"
        );
    }

    #[test]
    fn filters_set_list_remove_and_expire() {
        let f = LogFilters::new(LevelSpec::parse("info").unwrap(), true, 2);
        assert_eq!(f.max_hint(), LevelFilter::INFO);
        f.set("alice", 4, Duration::from_secs(600)).unwrap();
        assert_eq!(f.max_hint(), LevelFilter::DEBUG);
        f.set("bob", 5, Duration::from_millis(1)).unwrap();
        assert!(matches!(
            f.set("cy", 4, Duration::from_secs(1)),
            Err(FilterError::TooMany(2))
        ));
        std::thread::sleep(Duration::from_millis(5));
        let l = f.list();
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].uid.as_str(), l[0].level), ("alice", "debug"));
        assert!(l[0].remaining_secs > 590.0);
        let slot = f.slot_for("alice");
        assert_eq!(slot.level.load(Ordering::Relaxed), 4);
        assert!(f.remove("alice"));
        assert!(!f.remove("alice"));
        assert_eq!(slot.level.load(Ordering::Relaxed), 0);
        assert_eq!(f.max_hint(), LevelFilter::INFO);
        let off = LogFilters::new(LevelSpec::parse("info").unwrap(), false, 2);
        assert!(matches!(
            off.set("a", 4, Duration::from_secs(1)),
            Err(FilterError::Disabled)
        ));
    }
}
