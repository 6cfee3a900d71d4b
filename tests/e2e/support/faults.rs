//! Helpers of the fault-injection suite (`tests/faults`): one case at a time, since
//! each changes machine state that the others would see.

use std::sync::{Mutex, MutexGuard};

static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// Held for the whole of a fault case: no two cases break things at once.
pub fn exclusive() -> MutexGuard<'static, ()> {
    EXCLUSIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runtime an async fault case runs on, inside a plain `#[test]` that holds
/// [`exclusive`] outside it (a std lock must not be held across an await).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
