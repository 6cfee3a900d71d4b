//! Online backups of the SQLite store and their restore, for `im-server backup` and
//! `im-server restore`. A backup runs in its own process against the live database file
//! while the node serves: SQLite's online backup API copies every page in one step, that
//! is inside one read transaction, so the copy is the database as of one commit (in WAL
//! mode the node's writer is not blocked meanwhile). The copy is written beside its
//! destination, checked (`PRAGMA quick_check`), switched to a single self-contained file
//! (rollback journal) and renamed into place. A restore takes the store's lock (which a
//! running node holds: [`StoreLock`]), checks the backup, copies it into the data dir and
//! removes the old write-ahead log, so a node never starts on a restored file mixed with
//! a stale WAL. Postgres is backed up with its own tools (docs/backup.md).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

/// How long a backup or restore waits out a busy or locked database before giving up.
const BUSY_LIMIT: Duration = Duration::from_secs(60);

/// Errors of a backup or a restore; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The store's database file does not exist.
    #[error("no store at {0}: nothing to back up (is the data dir right?)")]
    NoStore(PathBuf),
    /// The destination exists; a backup never overwrites.
    #[error("{0} exists: a backup never overwrites a file; name a new one")]
    DestinationExists(PathBuf),
    /// A node is running on the store (its lock is held).
    #[error(
        "a node is running on {0} (it holds {0}.lock): stop it before restoring into its data dir"
    )]
    Running(PathBuf),
    /// The data dir already has a store and `--force` was not given.
    #[error("{0} exists: restoring would replace that store; pass --force to replace it")]
    StoreExists(PathBuf),
    /// The file to restore is not a sound im-server store.
    #[error("{path} is not a sound im-server store: {reason}")]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// SQLite failed on a file.
    #[error("{path}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A file could not be read, written or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What a backup or restore copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The file written.
    pub path: PathBuf,
    /// Database pages copied.
    pub pages: u64,
    /// The written file's size.
    pub bytes: u64,
    /// Messages in the copy.
    pub messages: u64,
    /// How long the copy took.
    pub took: Duration,
}

/// The store's exclusive lock (`<db>.lock`, `flock`), held by a running node for as long
/// as its store is open and by a restore while it replaces the file.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    /// Takes the lock of the database at `db`, or [`BackupError::Running`] if another
    /// process (or another open store) holds it.
    pub fn take(db: &Path) -> Result<StoreLock, BackupError> {
        let path = lock_path(db);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| BackupError::Io {
                path: path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        let rc = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        if rc == 0 {
            Ok(StoreLock { _file: file })
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Err(BackupError::Running(db.to_owned()))
            } else {
                Err(BackupError::Io { path, source: e })
            }
        }
    }
}

fn lock_path(db: &Path) -> PathBuf {
    suffixed(db, ".lock")
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn sqlite(path: &Path) -> impl Fn(rusqlite::Error) -> BackupError + '_ {
    move |source| BackupError::Sqlite {
        path: path.to_owned(),
        source,
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Copies the database at `from` (an open connection) into a new file at `to`, all pages
/// in one step (one read transaction), waiting out a busy or locked source.
fn copy_pages(from: &Connection, from_path: &Path, to: &Path) -> Result<u64, BackupError> {
    let mut dst = Connection::open(to).map_err(sqlite(to))?;
    let pages = {
        let backup = Backup::new(from, &mut dst).map_err(sqlite(to))?;
        let deadline = Instant::now() + BUSY_LIMIT;
        loop {
            match backup.step(-1).map_err(sqlite(from_path))? {
                StepResult::Done => break,
                StepResult::More | StepResult::Busy | StepResult::Locked
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => {
                    return Err(BackupError::NotAStore {
                        path: from_path.to_owned(),
                        reason: format!(
                            "the copy did not finish within {BUSY_LIMIT:?} ({other:?})"
                        ),
                    })
                }
            }
        }
        backup.progress().pagecount as u64
    };
    dst.close().map_err(|(_, e)| sqlite(to)(e))?;
    Ok(pages)
}

/// Checks that the file `conn` has open is sound and has the messages table; its
/// message count.
fn check(conn: &Connection, path: &Path) -> Result<u64, BackupError> {
    let not_store = |reason: String| BackupError::NotAStore {
        path: path.to_owned(),
        reason,
    };
    let verdict: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| not_store(e.to_string()))?;
    if verdict != "ok" {
        return Err(not_store(format!("quick_check: {verdict}")));
    }
    conn.query_row("SELECT count(*) FROM messages", [], |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
        .map_err(|e| not_store(format!("no messages table ({e})")))
}

/// Makes `path` durable: the file's data, then its directory's entry.
fn sync(path: &Path) -> Result<(), BackupError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

/// Backs up the live database at `db` into the new file `dest` while the node serves.
pub fn backup(db: &Path, dest: &Path) -> Result<Copied, BackupError> {
    let started = Instant::now();
    if dest.exists() {
        return Err(BackupError::DestinationExists(dest.to_owned()));
    }
    if !db.is_file() {
        return Err(BackupError::NoStore(db.to_owned()));
    }
    // Read-write without create: a WAL reader needs the shared-memory file; nothing is
    // written to the source.
    let src =
        Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(sqlite(db))?;
    src.busy_timeout(Duration::from_secs(10))
        .map_err(sqlite(db))?;
    let partial = suffixed(dest, ".partial");
    let _ = std::fs::remove_file(&partial);
    let result = (|| {
        let pages = copy_pages(&src, db, &partial)?;
        let copy = Connection::open(&partial).map_err(sqlite(&partial))?;
        // One self-contained file: no -wal beside it to forget.
        copy.query_row("PRAGMA journal_mode=DELETE", [], |_| Ok(()))
            .map_err(sqlite(&partial))?;
        let messages = check(&copy, &partial)?;
        copy.close().map_err(|(_, e)| sqlite(&partial)(e))?;
        sync(&partial)?;
        std::fs::rename(&partial, dest).map_err(io(dest))?;
        sync(dest)?;
        Ok((pages, messages))
    })();
    let (pages, messages) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    let bytes = std::fs::metadata(dest).map_err(io(dest))?.len();
    Ok(Copied {
        path: dest.to_owned(),
        pages,
        bytes,
        messages,
        took: started.elapsed(),
    })
}

/// Restores the backup `src` as the database at `db`, in a data dir no node runs on;
/// an existing store is replaced only with `force`.
pub fn restore(src: &Path, db: &Path, force: bool) -> Result<Copied, BackupError> {
    let started = Instant::now();
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let _lock = StoreLock::take(db)?;
    if db.exists() && !force {
        return Err(BackupError::StoreExists(db.to_owned()));
    }
    let from =
        Connection::open_with_flags(src, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sqlite(src))?;
    let messages = check(&from, src)?;
    let staged = suffixed(db, ".restoring");
    let _ = std::fs::remove_file(&staged);
    let pages = copy_pages(&from, src, &staged)?;
    let copy = Connection::open(&staged).map_err(sqlite(&staged))?;
    copy.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .map_err(sqlite(&staged))?;
    copy.close().map_err(|(_, e)| sqlite(&staged)(e))?;
    sync(&staged)?;
    // The old store's log and shared memory belong to the old file: gone before the swap.
    for stale in [suffixed(db, "-wal"), suffixed(db, "-shm")] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&stale)(e)),
        }
    }
    std::fs::rename(&staged, db).map_err(io(db))?;
    sync(db)?;
    let bytes = std::fs::metadata(db).map_err(io(db))?.len();
    Ok(Copied {
        path: db.to_owned(),
        pages,
        bytes,
        messages,
        took: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_refuses_a_second_taker() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("im.db");
        let held = StoreLock::take(&db).unwrap();
        assert!(matches!(StoreLock::take(&db), Err(BackupError::Running(_))));
        drop(held);
        assert!(StoreLock::take(&db).is_ok());
    }

    #[test]
    fn backups_never_overwrite_and_restores_check_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("im.db");
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE messages (x); INSERT INTO messages VALUES (1);",
        )
        .unwrap();
        let dest = dir.path().join("copy.db");
        let done = backup(&db, &dest).unwrap();
        assert_eq!(done.messages, 1);
        assert!(matches!(
            backup(&db, &dest),
            Err(BackupError::DestinationExists(_))
        ));
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a database at all, really not").unwrap();
        let target = dir.path().join("restored/im.db");
        assert!(matches!(
            restore(&junk, &target, false),
            Err(BackupError::NotAStore { .. })
        ));
        assert_eq!(restore(&dest, &target, false).unwrap().messages, 1);
        assert!(matches!(
            restore(&dest, &target, false),
            Err(BackupError::StoreExists(_))
        ));
        assert!(restore(&dest, &target, true).is_ok());
    }
}
