//! Allocator stats from jemalloc (`tikv-jemalloc-ctl`): the epoch is advanced before
//! each read, since jemalloc caches its statistics; the purge that hands the freed
//! pages of a large short-lived allocation (a profile's report) back to the system; and
//! the memory outside jemalloc: the C allocator's heap and what SQLite holds in it.

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

/// Bytes the embedded SQLite holds now, across its connections (page caches, prepared
/// statements): they live in the C allocator's heap, not in jemalloc's figures.
pub fn sqlite_used() -> u64 {
    // SAFETY: a plain read of SQLite's global memory counter; no arguments.
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    used.max(0) as u64
}

/// Bytes the C allocator has taken from the system (glibc's arenas and its large
/// mappings); `None` off glibc.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn c_heap() -> Option<u64> {
    // SAFETY: mallinfo2 takes nothing and returns a plain struct by value.
    let info = unsafe { libc::mallinfo2() };
    Some((info.arena + info.hblkhd) as u64)
}

/// Bytes the C allocator has taken from the system; `None` off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn c_heap() -> Option<u64> {
    None
}
