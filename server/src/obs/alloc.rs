//! Allocator stats from jemalloc (`tikv-jemalloc-ctl`): the epoch is advanced before
//! each read, since jemalloc caches its statistics.

use serde::Serialize;

/// jemalloc's figures, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AllocStats {
    /// Bytes allocated by the application.
    pub allocated: u64,
    /// Bytes in active pages (allocated plus fragmentation).
    pub active: u64,
    /// Bytes in physically resident pages.
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained (unmapped from use but kept for reuse).
    pub retained: u64,
    /// Bytes of allocator metadata.
    pub metadata: u64,
}

impl AllocStats {
    /// `(kind, value)` pairs for the `im_alloc_bytes{kind}` gauge.
    pub fn kinds(&self) -> [(&'static str, u64); 6] {
        [
            ("allocated", self.allocated),
            ("active", self.active),
            ("resident", self.resident),
            ("mapped", self.mapped),
            ("retained", self.retained),
            ("metadata", self.metadata),
        ]
    }
}

/// Reads fresh stats; `None` if jemalloc does not answer.
pub fn read() -> Option<AllocStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    Some(AllocStats {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
        mapped: stats::mapped::read().ok()? as u64,
        retained: stats::retained::read().ok()? as u64,
        metadata: stats::metadata::read().ok()? as u64,
    })
}
