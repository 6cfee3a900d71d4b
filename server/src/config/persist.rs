//! `[persist]`: the group commit of the persistence writer (batch size and wait, the
//! delivery cursors' wait for a batch, queue capacity, the OVERLOADED retry hint), with
//! its defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::range;
use super::ConfigError;

/// Persistence (group commit) settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Persist {
    /// A batch closes at this many messages.
    pub batch_max: u32,
    /// ... or after this many milliseconds of waiting for more (0: commit what is queued).
    pub batch_wait_ms: u32,
    /// A round holding only delivery cursors (DeliverAck) waits this long for a Send
    /// or another write to share its commit (0: it commits at once). Cursors are
    /// advisory: one lost at a crash means the device is sent those messages again.
    pub cursor_wait_ms: u32,
    /// Bounded persistence queue; a full queue answers OVERLOADED.
    pub queue_capacity: u32,
    /// retry_after_ms sent with OVERLOADED.
    pub retry_after_ms: u32,
}

impl Default for Persist {
    fn default() -> Self {
        Persist {
            batch_max: 512,
            batch_wait_ms: 1,
            cursor_wait_ms: 20,
            queue_capacity: 20_000,
            retry_after_ms: 50,
        }
    }
}

impl Persist {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range("persist.batch_max", self.batch_max, 1, 10_000)?;
        range("persist.batch_wait_ms", self.batch_wait_ms, 0, 1000)?;
        range("persist.cursor_wait_ms", self.cursor_wait_ms, 0, 1000)?;
        range("persist.queue_capacity", self.queue_capacity, 1, 10_000_000)?;
        range("persist.retry_after_ms", self.retry_after_ms, 1, 60_000)?;
        Ok(())
    }
}
