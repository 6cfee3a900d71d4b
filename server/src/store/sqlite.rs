//! SQLite backend (the embedded default): WAL journal, one writer connection (the
//! persistence writer is its only user) and a small pool of read-only readers.
//!
//! `synchronous` is FULL by default: with WAL that fsyncs the log at each commit, so an
//! acked message survives power loss as well as SIGKILL; group commit keeps the fsync
//! count per batch, not per message. NORMAL (config `store.sqlite_synchronous`) still
//! survives a process crash but may lose the last commits on power loss.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use super::sql::sql_store_impl;
use super::StoreError;

/// The SQLite store.
pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs the migrations.
    pub async fn open(path: &Path, full_sync: bool, readers: u32) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let base = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(false);
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
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
        sqlx::migrate!("../migrations/sqlite").run(&write).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(readers.max(1))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(base.read_only(true))
            .await?;
        Ok(SqliteStore { write, read })
    }
}

sql_store_impl!(SqliteStore, sqlx::Sqlite, "sqlite");
