//! The skeleton both on-demand profilers share (`profile` for the CPU, `heap` for
//! jemalloc): a process-wide slot that allows one capture of its kind at a time, and the
//! short-lived, low-priority thread that builds the report while the request waits on
//! a channel, so neither a runtime thread nor a reusable pool thread is held or reniced,
//! and which then frees the symbol cache the rendering filled and purges the freed pages.

use std::sync::atomic::{AtomicBool, Ordering};

/// A process-wide right to capture, taken from its flag and given back on drop.
pub struct Slot(&'static AtomicBool);

impl Slot {
    /// Takes the right `flag` stands for, or `None` while a capture holds it.
    pub(super) fn take(flag: &'static AtomicBool) -> Option<Slot> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Slot(flag))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Runs `report` on a new thread named `name` at the lowest CPU priority and waits for
/// its answer; `fail` words the errors of the thread itself.
pub(super) async fn on_report_thread<T, E>(
    name: &str,
    report: impl FnOnce() -> Result<T, E> + Send + 'static,
    fail: impl Fn(String) -> E,
) -> Result<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            super::compactor::lower_thread_priority();
            let answer = report();
            // Symbolizing parsed the binary's DWARF into backtrace-rs's process-wide
            // cache (about 100 MiB for this binary), which nothing else reads: give it
            // back, or one capture raises the node's memory for good.
            backtrace::clear_symbol_cache();
            if let Err(errno) = super::alloc::purge() {
                tracing::debug!(errno, "jemalloc purge after a profile failed");
            }
            let _ = tx.send(answer);
        })
        .map_err(|e| fail(format!("cannot start the report thread: {e}")))?;
    rx.await
        .map_err(|_| fail("report thread failed".to_owned()))?
}
