//! Runtime and task figures. Owns the process-wide `tokio-metrics` task monitors of the
//! node's long-lived tasks ([`Task`]: the persistence writer, the router, the receipt
//! task, the cluster link) and [`spawn`], which starts such a task under its monitor;
//! and [`RuntimeSampler`], which the once-a-second sampler calls to read tokio's stable
//! runtime metrics (workers, alive tasks, the global queue, each worker's busy time and
//! parks) and the monitors into the `im_runtime_*` and `im_task_*` series and the
//! overview's `runtime` object.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, Counter, Gauge};
use tokio::task::JoinHandle;
use tokio_metrics::{TaskMetrics, TaskMonitorCore, TaskMonitorCoreBuilder};

pub use im_admin_api::{RuntimeStats, TaskStats};

/// A poll at least this long counts as slow: it holds a worker for a millisecond, and
/// every task queued behind it on that worker waits that long.
pub const SLOW_POLL: Duration = Duration::from_millis(1);

/// A long-lived task kind with its own monitor (label `task` of `im_task_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// The persistence writer (`persist::Writer::run`).
    Writer,
    /// The router (`route::Router::run`).
    Router,
    /// The receipt task (`route::receipts::run`).
    Receipts,
    /// The cluster link's inbound envelopes (pushes from other nodes).
    ClusterInbound,
    /// The rest of the cluster link: load reports, group notices, presence writes and
    /// watches, the registry watch and the supervisor.
    Cluster,
}

impl Task {
    /// Every task kind, in the order of the overview's `runtime.tasks`.
    pub const ALL: [Task; 5] = [
        Task::Writer,
        Task::Router,
        Task::Receipts,
        Task::ClusterInbound,
        Task::Cluster,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Task::Writer => "writer",
            Task::Router => "router",
            Task::Receipts => "receipts",
            Task::ClusterInbound => "cluster_inbound",
            Task::Cluster => "cluster",
        }
    }

    /// Its monitor (process-wide: every pipeline of the process adds to it).
    pub fn monitor(self) -> &'static TaskMonitorCore {
        &MONITORS[self as usize]
    }
}

const fn monitor() -> TaskMonitorCore {
    TaskMonitorCoreBuilder::new()
        .with_slow_poll_threshold(SLOW_POLL)
        .build()
}

static MONITORS: [TaskMonitorCore; 5] = [monitor(), monitor(), monitor(), monitor(), monitor()];

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the task monitors on or off for the tasks spawned from now on
/// (`obs.task_monitors`; off only to measure their cost).
pub fn set_task_monitors(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether tasks spawned now are monitored.
pub fn task_monitors() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Spawns `fut` on the current runtime, under `task`'s monitor when monitors are on.
pub fn spawn<F>(task: Task, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if task_monitors() {
        tokio::spawn(task.monitor().instrument(fut))
    } else {
        tokio::spawn(fut)
    }
}

/// The series of one worker.
struct Worker {
    busy_ratio: Gauge,
    busy_secs: Counter,
    parks: Counter,
    last_busy: Duration,
}

/// The series of one task kind and its figures at the last sample.
struct TaskSeries {
    task: Task,
    instrumented: Counter,
    alive: Gauge,
    polls: Counter,
    poll_secs: Counter,
    slow_polls: Counter,
    slow_poll_secs: Counter,
    scheduled: Counter,
    scheduled_secs: Counter,
    mean_poll: Gauge,
    mean_scheduled: Gauge,
    last: TaskMetrics,
}

/// Reads the runtime and the task monitors once per sampler tick; keeps what it needs
/// to turn the running totals into the last interval's ratios and means.
pub struct RuntimeSampler {
    handle: Option<tokio::runtime::Handle>,
    workers: Vec<Worker>,
    tasks: Vec<TaskSeries>,
    last: Option<Instant>,
}

impl RuntimeSampler {
    /// A sampler of the runtime it is created on (none outside a runtime: then
    /// [`RuntimeSampler::sample`] answers `None`). Registers every series at zero.
    pub fn new() -> Self {
        let handle = tokio::runtime::Handle::try_current().ok();
        let n = handle.as_ref().map_or(0, |h| h.metrics().num_workers());
        let workers = (0..n)
            .map(|i| {
                let w = i.to_string();
                Worker {
                    busy_ratio: gauge!("im_runtime_worker_busy_ratio", "worker" => w.clone()),
                    busy_secs: counter!("im_runtime_worker_busy_seconds_total", "worker" => w.clone()),
                    parks: counter!("im_runtime_worker_parks_total", "worker" => w),
                    last_busy: Duration::ZERO,
                }
            })
            .collect();
        let tasks = Task::ALL
            .iter()
            .map(|&task| {
                let t = task.name();
                TaskSeries {
                    task,
                    instrumented: counter!("im_task_instrumented_total", "task" => t),
                    alive: gauge!("im_task_alive", "task" => t),
                    polls: counter!("im_task_polls_total", "task" => t),
                    poll_secs: counter!("im_task_poll_seconds_total", "task" => t),
                    slow_polls: counter!("im_task_slow_polls_total", "task" => t),
                    slow_poll_secs: counter!("im_task_slow_poll_seconds_total", "task" => t),
                    scheduled: counter!("im_task_scheduled_total", "task" => t),
                    scheduled_secs: counter!("im_task_scheduled_delay_seconds_total", "task" => t),
                    mean_poll: gauge!("im_task_mean_poll_seconds", "task" => t),
                    mean_scheduled: gauge!("im_task_mean_scheduled_delay_seconds", "task" => t),
                    last: TaskMetrics::default(),
                }
            })
            .collect();
        let mut s = RuntimeSampler {
            handle,
            workers,
            tasks,
            last: None,
        };
        // Every series exists from the start (at the figures so far).
        s.sample(Instant::now());
        s
    }

    /// Reads the runtime and the monitors at `now`, sets the series and returns the
    /// overview's `runtime` object (`None` outside a runtime).
    pub fn sample(&mut self, now: Instant) -> Option<RuntimeStats> {
        let handle = self.handle.as_ref()?;
        let m = handle.metrics();
        let dt = self
            .last
            .map(|t| now.duration_since(t).as_secs_f64())
            .filter(|d| *d > 1e-3);
        self.last = Some(now);

        let mut worker_busy_ratio = Vec::with_capacity(self.workers.len());
        let (mut busy_total, mut busy_delta) = (Duration::ZERO, Duration::ZERO);
        for (i, w) in self.workers.iter_mut().enumerate() {
            let busy = m.worker_total_busy_duration(i);
            let delta = busy.saturating_sub(w.last_busy);
            w.last_busy = busy;
            busy_total += busy;
            busy_delta += delta;
            let ratio = dt.map_or(0.0, |dt| (delta.as_secs_f64() / dt).clamp(0.0, 1.0));
            w.busy_ratio.set(ratio);
            w.busy_secs.absolute(busy.as_secs());
            w.parks.absolute(m.worker_park_count(i));
            worker_busy_ratio.push(ratio);
        }
        let workers = self.workers.len();
        let busy_ratio = match dt {
            Some(dt) if workers > 0 => {
                (busy_delta.as_secs_f64() / (dt * workers as f64)).clamp(0.0, 1.0)
            }
            _ => 0.0,
        };
        let alive_tasks = m.num_alive_tasks() as u64;
        let global_queue_depth = m.global_queue_depth() as u64;
        gauge!("im_runtime_workers").set(workers as f64);
        gauge!("im_runtime_alive_tasks").set(alive_tasks as f64);
        gauge!("im_runtime_global_queue_depth").set(global_queue_depth as f64);
        gauge!("im_runtime_busy_ratio").set(busy_ratio);

        let monitors = task_monitors();
        let tasks = self
            .tasks
            .iter_mut()
            .map(|s| {
                let now_m = s.task.monitor().cumulative();
                let stats = task_stats(s.task, &now_m, &s.last);
                s.last = now_m;
                s.instrumented.absolute(stats.instrumented);
                s.alive.set(stats.alive as f64);
                s.polls.absolute(stats.polls_total);
                s.poll_secs.absolute(now_m.total_poll_duration.as_secs());
                s.slow_polls.absolute(stats.slow_polls_total);
                s.slow_poll_secs
                    .absolute(now_m.total_slow_poll_duration.as_secs());
                s.scheduled.absolute(stats.scheduled_total);
                s.scheduled_secs
                    .absolute(now_m.total_scheduled_duration.as_secs());
                s.mean_poll.set(stats.mean_poll_us / 1e6);
                s.mean_scheduled.set(stats.mean_scheduled_delay_us / 1e6);
                stats
            })
            // A kind never spawned (the cluster's on a single node) is left out.
            .filter(|t| monitors && t.instrumented > 0)
            .collect();
        Some(RuntimeStats {
            workers: workers as u64,
            alive_tasks,
            global_queue_depth,
            busy_ratio,
            worker_busy_ratio,
            busy_secs_total: busy_total.as_secs_f64(),
            task_monitors: monitors,
            slow_poll_threshold_us: SLOW_POLL.as_micros() as u64,
            tasks,
        })
    }
}

impl Default for RuntimeSampler {
    fn default() -> Self {
        Self::new()
    }
}

/// One task kind's figures: totals from `now`, the last interval from `now - then`.
fn task_stats(task: Task, now: &TaskMetrics, then: &TaskMetrics) -> TaskStats {
    let polls = now.total_poll_count.saturating_sub(then.total_poll_count);
    let poll_time = now
        .total_poll_duration
        .saturating_sub(then.total_poll_duration);
    let scheduled = now
        .total_scheduled_count
        .saturating_sub(then.total_scheduled_count);
    let scheduled_time = now
        .total_scheduled_duration
        .saturating_sub(then.total_scheduled_duration);
    let mean_us = |d: Duration, n: u64| {
        if n == 0 {
            0.0
        } else {
            d.as_secs_f64() * 1e6 / n as f64
        }
    };
    TaskStats {
        task: task.name().to_owned(),
        instrumented: now.instrumented_count,
        alive: now.instrumented_count.saturating_sub(now.dropped_count),
        polls_total: now.total_poll_count,
        poll_secs_total: now.total_poll_duration.as_secs_f64(),
        slow_polls_total: now.total_slow_poll_count,
        slow_poll_secs_total: now.total_slow_poll_duration.as_secs_f64(),
        scheduled_total: now.total_scheduled_count,
        scheduled_delay_secs_total: now.total_scheduled_duration.as_secs_f64(),
        polls,
        mean_poll_us: mean_us(poll_time, polls),
        slow_polls: now
            .total_slow_poll_count
            .saturating_sub(then.total_slow_poll_count),
        mean_scheduled_delay_us: mean_us(scheduled_time, scheduled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A monitored task that is woken and polled shows in the figures; its busy
    /// worker too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn monitored_task_counts_polls_and_delays() {
        let mut s = RuntimeSampler::new();
        let before = Task::Receipts.monitor().cumulative();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(8);
        let h = spawn(Task::Receipts, async move {
            let mut n = 0;
            while let Some(v) = rx.recv().await {
                n += v;
                // A slow poll: holds the worker past the threshold.
                std::thread::sleep(SLOW_POLL * 2);
            }
            n
        });
        for i in 0..5 {
            tx.send(i).await.expect("task alive");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(tx);
        assert_eq!(h.await.expect("joined"), 10);
        let stats = s.sample(Instant::now()).expect("on a runtime");
        assert_eq!(stats.workers, 2);
        assert_eq!(stats.worker_busy_ratio.len(), 2);
        assert!(stats.busy_secs_total > 0.0);
        let t = stats
            .tasks
            .iter()
            .find(|t| t.task == "receipts")
            .expect("receipts listed");
        let after = Task::Receipts.monitor().cumulative();
        assert!(after.instrumented_count > before.instrumented_count);
        assert!(t.polls_total >= before.total_poll_count + 5, "{t:?}");
        assert!(
            t.slow_polls_total >= before.total_slow_poll_count + 5,
            "{t:?}"
        );
        assert!(t.scheduled_total > before.total_scheduled_count, "{t:?}");
        assert!(t.polls >= 5 && t.mean_poll_us > 0.0, "{t:?}");
        assert!(t.slow_poll_secs_total >= 0.010, "{t:?}");
    }

    /// Outside a runtime there is no runtime object.
    #[test]
    fn outside_a_runtime_there_is_nothing_to_read() {
        let mut s = RuntimeSampler::new();
        assert!(s.sample(Instant::now()).is_none());
    }
}
