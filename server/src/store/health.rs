//! Store health: whether this node may take Sends, and why not. Two facts make it up,
//! each with one writer:
//! - the last commit's fault, set and cleared by the persistence writer
//!   (`persist`): a storage error that persists (disk full, I/O error, a
//!   read-only file system) or a store that does not answer in time. The writer clears
//!   it when a commit, or its probe write while idle, succeeds again;
//! - free space under the floor (`store.min_free_disk_mb`), set each sample by the
//!   sampler (`obs::sampler`) from the data dir's file system (SQLite only: Postgres's
//!   disk is not ours to see).
//!
//! While either holds, Sends are refused at once with OVERLOADED and a retry hint (so
//! nothing is acked that is not durably committed, and nothing queues behind a store
//! that cannot commit), and `/readyz` answers 503 with the reason.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::StoreError;

/// Why commits fail, as one word (`/readyz`, logs, `im_store_fault{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// No space left on the device (SQLITE_FULL, Postgres `53100`).
    DiskFull = 1,
    /// The disk or file system failed (SQLITE_IOERR, Postgres class `58`).
    IoError = 2,
    /// The database or its file system is read-only.
    ReadOnly = 3,
    /// The store does not answer: no connection, or a commit past its time bound.
    Down = 4,
}

impl Fault {
    /// Every fault, for metric labels.
    pub const ALL: [Fault; 4] = [
        Fault::DiskFull,
        Fault::IoError,
        Fault::ReadOnly,
        Fault::Down,
    ];

    /// The reason word.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::DiskFull => "disk_full",
            Fault::IoError => "io_error",
            Fault::ReadOnly => "read_only",
            Fault::Down => "store_down",
        }
    }

    fn from_u8(v: u8) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| *f as u8 == v)
    }
}

/// Sorts a failed commit: `Some` for a fault of the store itself, which will fail the
/// next commit too; `None` for an error of this batch alone.
pub fn classify(e: &StoreError) -> Option<Fault> {
    let e = match e {
        StoreError::Db(e) => e,
        StoreError::Sqlite(e) => {
            return e.sqlite_error().and_then(|f| sqlite_fault(f.extended_code))
        }
        StoreError::Io(_) => return Some(Fault::IoError),
        StoreError::Timeout(_) | StoreError::WriterGone => return Some(Fault::Down),
        _ => return None,
    };
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // SQLite reports its (extended) result code as a number. Postgres reports
            // the SQLSTATE.
            if let Ok(n) = code.parse::<i32>() {
                return sqlite_fault(n);
            }
            match code.as_ref() {
                "53100" => Some(Fault::DiskFull),
                "25006" => Some(Fault::ReadOnly),
                c if c.starts_with("58") => Some(Fault::IoError),
                // Connection exceptions, shutdown in progress, cannot connect now.
                c if c.starts_with("08") || c.starts_with("57P") => Some(Fault::Down),
                _ => None,
            }
        }
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_) => Some(Fault::Down),
        _ => None,
    }
}

/// A SQLite (extended) result code's fault; the primary code is the low byte.
fn sqlite_fault(code: i32) -> Option<Fault> {
    match code & 0xff {
        13 => Some(Fault::DiskFull),          // SQLITE_FULL
        10 | 11 | 26 => Some(Fault::IoError), // IOERR, CORRUPT, NOTADB
        8 => Some(Fault::ReadOnly),           // SQLITE_READONLY
        14 => Some(Fault::IoError),           // SQLITE_CANTOPEN
        _ => None,
    }
}

/// The node's store health, shared by the writer, the sampler, the pipeline and the
/// admin API. All atomics: read on every Send.
#[derive(Debug, Default)]
pub struct StoreHealth {
    fault: AtomicU8,
    disk_low: AtomicBool,
}

impl StoreHealth {
    /// The reason Sends are refused now, if they are: a commit fault first, then low disk.
    pub fn refusal(&self) -> Option<&'static str> {
        match Fault::from_u8(self.fault.load(Ordering::Relaxed)) {
            Some(f) => Some(f.name()),
            None if self.disk_low.load(Ordering::Relaxed) => Some("disk_low"),
            None => None,
        }
    }

    /// The commit fault in force.
    pub fn fault(&self) -> Option<Fault> {
        Fault::from_u8(self.fault.load(Ordering::Relaxed))
    }

    /// Sets (or with `None` clears) the commit fault; returns the previous one. Only the
    /// persistence writer calls this.
    pub fn set_fault(&self, f: Option<Fault>) -> Option<Fault> {
        Fault::from_u8(self.fault.swap(f.map_or(0, |f| f as u8), Ordering::Relaxed))
    }

    /// Records whether the data dir's free space is under the floor; returns the
    /// previous value. Only the sampler calls this.
    pub fn set_disk_low(&self, low: bool) -> bool {
        self.disk_low.swap(low, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_wins_over_low_disk_and_clears() {
        let h = StoreHealth::default();
        assert_eq!(h.refusal(), None);
        h.set_disk_low(true);
        assert_eq!(h.refusal(), Some("disk_low"));
        assert_eq!(h.set_fault(Some(Fault::DiskFull)), None);
        assert_eq!(h.refusal(), Some("disk_full"));
        assert_eq!(h.set_fault(None), Some(Fault::DiskFull));
        h.set_disk_low(false);
        assert_eq!(h.refusal(), None);
    }

    #[test]
    fn pool_timeouts_are_a_store_down() {
        let e = StoreError::Db(sqlx::Error::PoolTimedOut);
        assert_eq!(classify(&e), Some(Fault::Down));
        let e = StoreError::Db(sqlx::Error::RowNotFound);
        assert_eq!(classify(&e), None);
    }
}
