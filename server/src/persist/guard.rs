//! The writer's guard against a failing store: the time bound on every write and the
//! commit fault of the node's [`StoreHealth`], which a fault of the store sets and a
//! successful write clears (with the `im_store_writable` and `im_store_fault` gauges).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{health, Fault, StoreError, StoreHealth};

/// How the writer meets a failing store (from `store.*`).
#[derive(Debug, Clone)]
pub struct Guard {
    /// The node's store health; the writer owns its commit fault.
    pub health: Arc<StoreHealth>,
    /// A write still running after this long is abandoned and counts as a fault.
    pub unavailable_after: Duration,
    /// While a fault holds, one write is tried this often (a real batch or a probe);
    /// the rest of the queue is answered OVERLOADED without touching the store.
    pub probe_interval: Duration,
}

impl Guard {
    /// From the config, with a new (healthy) [`StoreHealth`].
    pub fn new(c: &crate::config::StoreConfig) -> Self {
        Guard {
            health: Arc::new(StoreHealth::default()),
            unavailable_after: Duration::from_millis(c.unavailable_after_ms.into()),
            probe_interval: Duration::from_millis(c.probe_interval_ms.into()),
        }
    }

    /// Runs one write under the time bound and records its outcome in the health
    /// (`since`: when the fault in force started): the one way the writer writes.
    pub(super) async fn write<T>(
        &self,
        since: &mut Option<Instant>,
        write: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = self.bounded(write).await;
        self.record(result.as_ref().map(|_| ()), since);
        result
    }

    /// Runs one write under the time bound.
    pub(super) async fn bounded<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.unavailable_after, write)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.unavailable_after)))
    }

    /// Records a write's outcome in the health: a fault of the store sets it (logged
    /// once, when it starts), a success clears it (logged with how long it lasted).
    pub(super) fn record(&self, result: Result<(), &StoreError>, since: &mut Option<Instant>) {
        match result {
            Ok(()) => {
                if let Some(old) = self.health.set_fault(None) {
                    let took = since.take().map_or(0, |t| t.elapsed().as_millis() as u64);
                    tracing::warn!(
                        reason = old.name(),
                        took_ms = took,
                        "store writable again; sends accepted"
                    );
                    set_fault_gauges(None);
                }
            }
            Err(e) => {
                let Some(fault) = health::classify(e) else {
                    return;
                };
                if self.health.set_fault(Some(fault)) != Some(fault) {
                    *since = Some(Instant::now());
                    tracing::error!(
                        reason = fault.name(),
                        error = %e,
                        "store failing: sends refused (OVERLOADED) until a write succeeds"
                    );
                    metrics::counter!("im_store_faults_total", "reason" => fault.name())
                        .increment(1);
                    set_fault_gauges(Some(fault));
                }
            }
        }
    }
}

/// `im_store_writable` and `im_store_fault{reason}` for the fault in force.
pub(super) fn set_fault_gauges(fault: Option<Fault>) {
    metrics::gauge!("im_store_writable").set(if fault.is_none() { 1.0 } else { 0.0 });
    for f in Fault::ALL {
        metrics::gauge!("im_store_fault", "reason" => f.name()).set(if Some(f) == fault {
            1.0
        } else {
            0.0
        });
    }
}
