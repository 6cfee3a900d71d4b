//! Allocator stats from jemalloc (`tikv-jemalloc-ctl`): the epoch is advanced before
//! each read, since jemalloc caches its statistics; and the purge that hands the freed
//! pages of a large short-lived allocation (a profile's report) back to the system.

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

/// Hands every arena's unused dirty pages back to the system now, rather than over
/// jemalloc's decay time: after a profile's report, which frees a hundred MiB at once.
/// Returns jemalloc's error number, if any.
pub fn purge() -> Result<(), i32> {
    // MALLCTL_ARENAS_ALL (4096) names every arena; the call takes and returns nothing.
    // SAFETY: a NUL-terminated name and null in/out pointers, as this mallctl requires.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}
