//! SQLite backend (the embedded default): WAL journal, the commit thread's connection
//! for message batches (`store::sqlite_commit`), one more writer connection for the
//! other writes (group changes, read state; the persistence writer is its main user)
//! and a small pool of read-only readers.
//!
//! `synchronous` is FULL by default: with WAL that fsyncs the log at each commit, so an
//! acked message survives power loss as well as SIGKILL; group commit keeps the fsync
//! count per batch, not per message. NORMAL (config `store.sqlite_synchronous`) still
//! survives a process crash but may lose the last commits on power loss.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool};

use super::sql::Backend;
use super::sqlite_commit::CommitThread;
use super::{Committed, CursorUpdate, NewMessage};
use super::{StoreError, Timeouts};

/// The SQLite store.
pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
    commits: CommitThread,
    /// The WAL checkpointer thread (`store::sqlite_checkpoint`); dropped with the store.
    _checkpoints: super::sqlite_checkpoint::Checkpointer,
    /// A node's store holds the file's lock while open ([`SqliteStore::open_exclusive`]):
    /// a restore, or a second node, is refused meanwhile.
    _lock: Option<super::backup::StoreLock>,
    /// The webhook outbox's connection for claims and redelivery (lazy; `store::outbox`).
    outbox: SqlitePool,
    /// The outbox rows claimed in memory (one node: claims are plain reads).
    in_flight: super::sql::InFlight,
}

/// Bounds what SQLite holds across every connection of the process to `mib` MiB (its
/// soft heap limit: past it, page caches recycle their pages instead of growing; 0: no
/// limit). `store.sqlite_memory_mib`.
pub fn limit_memory(mib: u32) {
    // SAFETY: sets SQLite's global soft heap limit; takes a plain integer, thread-safe.
    unsafe {
        rusqlite::ffi::sqlite3_soft_heap_limit64(i64::from(mib) << 20);
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs the migrations, with the
    /// default timeouts.
    pub async fn open(path: &Path, full_sync: bool, readers: u32) -> Result<Self, StoreError> {
        Self::open_timed(path, full_sync, readers, Timeouts::default()).await
    }

    /// As [`SqliteStore::open`], waiting at most `timeouts.acquire` for a connection.
    pub async fn open_timed(
        path: &Path,
        full_sync: bool,
        readers: u32,
        timeouts: Timeouts,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let base = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(false)
            // The checkpointer thread does the checkpoints (`store::sqlite_checkpoint`),
            // and a reset log is cut back to its limit.
            .pragma("wal_autocheckpoint", "0")
            .pragma(
                "journal_size_limit",
                super::sqlite_checkpoint::JOURNAL_SIZE_LIMIT.to_string(),
            );
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(timeouts.acquire)
            .connect_with(
                base.clone()
                    .create_if_missing(true)
                    .synchronous(if full_sync {
                        SqliteSynchronous::Full
                    } else {
                        SqliteSynchronous::Normal
                    }),
            )
            .await?;
        // A migration this binary does not know (a newer release ran it) does not stop
        // it: migrations only add, so the previous release runs on the newer schema
        // during a rolling upgrade or after a rollback (docs/upgrade.md).
        sqlx::migrate!("../migrations/sqlite")
            .set_ignore_missing(true)
            .run(&write)
            .await?;
        // No ping before each use: a connection to a local file does not go stale, and
        // the ping was a second round trip to the connection's worker thread per read.
        let read = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(readers.max(1))
            .acquire_timeout(timeouts.acquire)
            .connect_with(base.clone().read_only(true))
            .await?;
        let commits = CommitThread::start(path, full_sync)?;
        let checkpoints = super::sqlite_checkpoint::Checkpointer::start(path)?;
        let outbox = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            // The claims' plain reads and the admin API's redelivery; expansions and
            // outcomes ride on the commit thread (`store::sqlite_outbox`). NORMAL: a
            // redelivery lost to a power cut is asked for again, and it spares an fsync
            // while holding the write lock the message commits need.
            .connect_lazy_with(base.synchronous(SqliteSynchronous::Normal));
        Ok(SqliteStore {
            write,
            read,
            commits,
            _checkpoints: checkpoints,
            _lock: None,
            outbox,
            in_flight: super::sql::InFlight::default(),
        })
    }
}

impl SqliteStore {
    /// As [`SqliteStore::open_timed`], holding the database's lock (`<db>.lock`) for as
    /// long as the store is open: what a node opens. Refused while another node (or a
    /// restore) holds it. Other readers of the file (tools, tests) open it unlocked.
    pub async fn open_exclusive(
        path: &Path,
        full_sync: bool,
        readers: u32,
        timeouts: Timeouts,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let lock = super::backup::StoreLock::take(path).map_err(|e| {
            let message = match e {
                super::backup::BackupError::Running(p) => format!(
                    "another im-server has the store {} open (it holds its .lock file)",
                    p.display()
                ),
                other => other.to_string(),
            };
            StoreError::Io(std::io::Error::new(std::io::ErrorKind::WouldBlock, message))
        })?;
        let mut store = Self::open_timed(path, full_sync, readers, timeouts).await?;
        store._lock = Some(lock);
        Ok(store)
    }
}

impl Backend for SqliteStore {
    type DB = Sqlite;
    const NAME: &'static str = "sqlite";

    fn read(&self) -> &SqlitePool {
        &self.read
    }

    /// The writer connection, checked to be outside any transaction.
    ///
    /// This is the check that keeps a failed commit from eating later ones. When a write
    /// fails with SQLITE_FULL or SQLITE_IOERR, SQLite may roll the whole transaction back
    /// by itself; sqlx does not see that, its ROLLBACK then fails ("no transaction is
    /// active") and its transaction counter stays at 1. Its next `begin()` issues a
    /// SAVEPOINT instead of BEGIN, and once one of those fails too, the connection sits
    /// inside a transaction that is never committed: every later "commit" only releases a
    /// nested savepoint, the acks go out, and the rows vanish when the connection closes.
    /// So before each write: SQLite's own autocommit flag must say no transaction is open
    /// and sqlx's counter must be 0; otherwise the connection is closed (rolling back
    /// whatever it held, none of it acked) and a fresh one is opened.
    async fn writer(&self) -> Result<PoolConnection<Sqlite>, StoreError> {
        let mut conn = self.write.acquire().await?;
        if outside_transaction(&mut conn).await? {
            return Ok(conn);
        }
        tracing::warn!(
            "the store's writer connection was left inside a transaction; closing it and opening a new one"
        );
        metrics::counter!("im_store_connection_resets_total").increment(1);
        let _ = conn.close().await;
        let mut conn = self.write.acquire().await?;
        if outside_transaction(&mut conn).await? {
            return Ok(conn);
        }
        Err(sqlx::Error::Protocol("a new writer connection is inside a transaction".into()).into())
    }

    /// One batch commit, on the commit thread.
    async fn commit(
        &self,
        messages: &[NewMessage],
        cursors: &[CursorUpdate],
    ) -> Result<Vec<Committed>, StoreError> {
        self.commits.commit(messages, cursors).await
    }

    fn set_outbox(&self, on: bool) {
        self.commits.set_outbox(on);
    }

    fn outbox_on(&self) -> bool {
        self.commits.outbox_on()
    }

    fn outbox_pool(&self) -> &SqlitePool {
        &self.outbox
    }

    fn in_flight(&self) -> Option<&super::sql::InFlight> {
        Some(&self.in_flight)
    }

    /// On the commit thread, inside the message commits' transactions.
    fn outbox_write(
        &self,
        write: super::outbox::OutboxWrite,
    ) -> Option<impl std::future::Future<Output = Result<Vec<i64>, StoreError>> + Send> {
        Some(self.commits.outbox_write(write))
    }
}

/// True when neither SQLite nor sqlx thinks a transaction is open on `conn`.
async fn outside_transaction(conn: &mut sqlx::SqliteConnection) -> Result<bool, StoreError> {
    if sqlx::Connection::is_in_transaction(conn) {
        return Ok(false);
    }
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the handle is locked (the worker thread makes no call on it meanwhile);
    // sqlite3_get_autocommit only reads a flag of the connection.
    let autocommit =
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) };
    Ok(autocommit != 0)
}
