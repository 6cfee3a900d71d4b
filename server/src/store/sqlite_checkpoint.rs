//! The SQLite WAL checkpointer: one OS thread with its own connection that copies the
//! write-ahead log back into the database file, PASSIVE, every [`INTERVAL`]. Every other
//! connection of the store runs with `wal_autocheckpoint = 0`, so no message commit
//! ever does a checkpoint's work (copying thousands of pages and an fsync of the
//! database file, milliseconds on the commit path, which is what SQLite's automatic
//! checkpoint does to the commit that crosses its 1,000-page mark). A PASSIVE checkpoint
//! takes no write lock: commits go on while it copies. Durability does not change (a
//! commit is durable in the log, fsync'd by `synchronous`, before it is acked); the log
//! is reset by the first commit after a checkpoint that reached its end.
//!
//! Under commits that never pause a PASSIVE pass never reaches the log's end (new
//! frames arrive while it copies), so the log would never be reset and would grow by
//! every byte committed until the disk is full. Once the log holds
//! [`RESTART_FRAMES`] frames the thread runs a RESTART checkpoint instead: it holds new
//! writers back (they wait in their busy handler, at most the checkpointer's
//! [`BUSY_TIMEOUT`] plus the copy of what the last pass left), copies the rest, and the
//! next commit starts the log again from its beginning; [`JOURNAL_SIZE_LIMIT`] (set on
//! every connection of the store) then cuts the file back. So the log stays near
//! `RESTART_FRAMES` pages, and a commit pays for a checkpoint only that often.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::StoreError;

/// How often the log is checkpointed.
pub(crate) const INTERVAL: Duration = Duration::from_millis(250);

/// Log frames (pages) past which a RESTART checkpoint bounds the log: 16 MiB of 4 KiB
/// pages.
pub(crate) const RESTART_FRAMES: i64 = 4096;

/// The size the log file is cut back to when it is reset (`journal_size_limit`), bytes.
pub(crate) const JOURNAL_SIZE_LIMIT: i64 = 32 << 20;

/// How long the checkpointer waits for a writer or a reader to finish.
const BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// The checkpointer; dropping it stops the thread (after one last checkpoint).
pub(crate) struct Checkpointer {
    _stop: Sender<()>,
}

impl Checkpointer {
    /// Opens its connection (errors are the caller's) and starts the thread.
    pub(crate) fn start(path: &Path) -> Result<Self, StoreError> {
        let conn = open(path)?;
        let (stop, stopped) = channel::<()>();
        let path: PathBuf = path.to_owned();
        std::thread::Builder::new()
            .name("im-sqlite-checkpoint".into())
            .spawn(move || {
                let mut state = State {
                    conn: Some(conn),
                    path,
                    failing: false,
                };
                loop {
                    let last = matches!(
                        stopped.recv_timeout(INTERVAL),
                        Err(RecvTimeoutError::Disconnected)
                    );
                    state.checkpoint();
                    if last {
                        break;
                    }
                }
            })?;
        Ok(Checkpointer { _stop: stop })
    }
}

/// The checkpointer's connection; `synchronous` FULL, so a checkpoint fsyncs the
/// database file before the log is reused.
fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(conn)
}

/// One `wal_checkpoint` in `mode`: (busy, frames in the log, frames copied). A busy
/// RESTART (a reader still on the log) is not an error: the next pass tries again.
fn pass(conn: &Connection, mode: &str) -> Result<(i64, i64, i64), StoreError> {
    Ok(
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?,
    )
}

/// The thread's connection (none after a failure, until the next checkpoint opens one)
/// and whether the last checkpoint failed (a failure is logged once, not every time).
struct State {
    conn: Option<Connection>,
    path: PathBuf,
    failing: bool,
}

impl State {
    /// One PASSIVE checkpoint, and a RESTART one when the log has grown past
    /// [`RESTART_FRAMES`]: the log's frames and those not yet in the database file, as
    /// gauges. A failure is counted, logged when it starts, and the connection is
    /// reopened next time.
    fn checkpoint(&mut self) {
        let conn = match self.conn.take() {
            Some(c) => Ok(c),
            None => open(&self.path),
        };
        let done = conn.and_then(|c| {
            let mut frames = pass(&c, "PASSIVE")?;
            if frames.1 >= RESTART_FRAMES {
                frames = pass(&c, "RESTART")?;
                metrics::counter!("im_store_checkpoint_restarts_total").increment(1);
            }
            self.conn = Some(c);
            Ok((frames.1, frames.2))
        });
        match done {
            Ok((log, copied)) => {
                metrics::counter!("im_store_checkpoints_total").increment(1);
                metrics::gauge!("im_store_wal_frames").set(log.max(0) as f64);
                metrics::gauge!("im_store_wal_frames_behind").set((log - copied).max(0) as f64);
                if std::mem::take(&mut self.failing) {
                    tracing::info!("checkpointing the SQLite write-ahead log works again");
                }
            }
            Err(e) => {
                metrics::counter!("im_store_checkpoint_failures_total").increment(1);
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(error = %e, "checkpointing the SQLite write-ahead log failed; retrying every 250 ms");
                }
            }
        }
    }
}
