//! Helpers of the fault-injection suite (`tests/faults`): one case at a time, since
//! each changes machine state that the others would see.

use std::sync::{Mutex, MutexGuard};

static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// Held for the whole of a fault case: no two cases break things at once.
pub fn exclusive() -> MutexGuard<'static, ()> {
    EXCLUSIVE.lock().unwrap_or_else(|p| p.into_inner())
}
