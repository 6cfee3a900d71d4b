//! Allocator stats from jemalloc (`tikv-jemalloc-ctl`): the epoch is advanced before
//! each read, since jemalloc caches its statistics.

/// jemalloc's figures, bytes: the admin API's type (`overview.memory`).
pub use im_admin_api::AllocStats;

/// `(kind, value)` pairs of `m` for the `im_alloc_bytes{kind}` gauge.
pub fn kinds(m: &AllocStats) -> [(&'static str, u64); 6] {
    [
        ("allocated", m.allocated),
        ("active", m.active),
        ("resident", m.resident),
        ("mapped", m.mapped),
        ("retained", m.retained),
        ("metadata", m.metadata),
    ]
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
