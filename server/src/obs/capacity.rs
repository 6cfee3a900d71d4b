//! Capacity headroom: how many more connections and messages per
//! second this node can take before its first resource runs out. Pure arithmetic over
//! measured inputs; the formula is documented in `runbooks/capacity-headroom.md`.

/// Memory use the node should stay under, as a share of the limit.
pub const MEMORY_TARGET: f64 = 0.90;
/// File descriptors the node should stay under, as a share of RLIMIT_NOFILE.
pub const FD_TARGET: f64 = 0.95;
/// CPU busy ratio the node should stay under.
pub const CPU_TARGET: f64 = 0.80;
/// Fewest connections from which per-connection memory is measured, not estimated.
pub const MIN_CONNS_TO_MEASURE: u64 = 10;
/// Below this CPU busy ratio, CPU gives no useful extrapolation.
pub const MIN_BUSY_TO_EXTRAPOLATE: f64 = 0.05;

/// What the headroom is computed from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Live connections.
    pub connections: u64,
    /// Process RSS now.
    pub rss_bytes: u64,
    /// RSS at start-up, before any connection.
    pub baseline_rss_bytes: u64,
    /// Per-connection estimate used until enough connections exist to measure.
    pub conn_bytes_estimate: u64,
    /// Memory limit (cgroup, config or physical).
    pub memory_limit_bytes: u64,
    /// Open fds now.
    pub open_fds: u64,
    /// RLIMIT_NOFILE.
    pub max_fds: u64,
    /// CPU busy ratio of the cores available (0..1).
    pub cpu_busy: f64,
    /// Messages per second in + out.
    pub msg_rate: f64,
    /// The node's connection cap (`limits.max_connections` resolved; 0: none).
    pub max_connections: u64,
    /// The store's disk, when the node can see it (`None` for Postgres).
    pub disk: Option<Disk>,
}

/// The file system under the store's data dir.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Disk {
    /// Bytes free (for an unprivileged writer).
    pub free_bytes: u64,
    /// Size of the file system.
    pub total_bytes: u64,
    /// The free-space floor under which Sends are refused (`store.min_free_disk_mb`).
    pub floor_bytes: u64,
}

impl Disk {
    /// Whether free space is under the floor.
    pub fn low(&self) -> bool {
        self.floor_bytes > 0 && self.free_bytes < self.floor_bytes
    }
}

/// The headroom, as the overview shows it (`capacity`): the admin API's type.
pub use im_admin_api::Capacity as Headroom;

/// Computes the headroom.
pub fn compute(i: &Inputs) -> Headroom {
    let measured = i.connections >= MIN_CONNS_TO_MEASURE;
    let per_conn = if measured {
        (i.rss_bytes.saturating_sub(i.baseline_rss_bytes) / i.connections).max(1)
    } else {
        i.conn_bytes_estimate.max(1)
    };
    let mem_room = (i.memory_limit_bytes as f64 * MEMORY_TARGET - i.rss_bytes as f64).max(0.0);
    let by_memory = (mem_room / per_conn as f64) as u64;
    let by_fds = (i.max_fds as f64 * FD_TARGET - i.open_fds as f64).max(0.0) as u64;
    let busy_enough = i.cpu_busy >= MIN_BUSY_TO_EXTRAPOLATE;
    let cpu_scale = (CPU_TARGET - i.cpu_busy).max(0.0) / i.cpu_busy.max(f64::MIN_POSITIVE);
    let by_cpu =
        (busy_enough && i.connections > 0).then_some((i.connections as f64 * cpu_scale) as u64);
    let mut limiting = ("memory", by_memory);
    if by_fds < limiting.1 {
        limiting = ("fds", by_fds);
    }
    if let Some(c) = by_cpu {
        if c < limiting.1 {
            limiting = ("cpu", c);
        }
    }
    if i.max_connections > 0 {
        let by_cap = i.max_connections.saturating_sub(i.connections);
        if by_cap < limiting.1 {
            limiting = ("max_connections", by_cap);
        }
    }
    // Under the disk floor the node takes no Sends: no room for anyone.
    if i.disk.is_some_and(|d| d.low()) {
        limiting = ("disk", 0);
    }
    let ratio = |used: f64, limit: f64| {
        if limit > 0.0 {
            (1.0 - used / limit).clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    Headroom {
        per_connection_bytes: per_conn,
        per_connection_measured: measured,
        headroom_connections: limiting.1,
        headroom_msgs_per_sec: (busy_enough && i.msg_rate > 0.0).then_some(i.msg_rate * cpu_scale),
        ratio_memory: ratio(i.rss_bytes as f64, i.memory_limit_bytes as f64),
        ratio_fds: ratio(i.open_fds as f64, i.max_fds as f64),
        ratio_cpu: (1.0 - i.cpu_busy).clamp(0.0, 1.0),
        ratio_disk: i.disk.map(|d| {
            let usable = d.total_bytes.saturating_sub(d.floor_bytes);
            let used = d.total_bytes.saturating_sub(d.free_bytes);
            ratio(used as f64, usable as f64)
        }),
        disk_free_bytes: i.disk.map(|d| d.free_bytes),
        limiting_resource: limiting.0.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Inputs {
        Inputs {
            connections: 1000,
            rss_bytes: 100 << 20,
            baseline_rss_bytes: 50 << 20,
            conn_bytes_estimate: 20_000,
            memory_limit_bytes: 1 << 30,
            open_fds: 1010,
            max_fds: 1 << 20,
            cpu_busy: 0.01,
            msg_rate: 0.0,
            max_connections: 0,
            disk: None,
        }
    }

    #[test]
    fn a_disk_under_its_floor_leaves_no_room() {
        let mut i = base();
        i.disk = Some(Disk {
            free_bytes: 600 << 20,
            total_bytes: 1100 << 20,
            floor_bytes: 100 << 20,
        });
        let h = compute(&i);
        assert_eq!(h.limiting_resource, "memory");
        assert_eq!(h.ratio_disk, Some(0.5));
        i.disk = Some(Disk {
            free_bytes: 50 << 20,
            ..i.disk.unwrap_or_default()
        });
        let h = compute(&i);
        assert_eq!(
            (h.limiting_resource.as_str(), h.headroom_connections),
            ("disk", 0)
        );
        assert_eq!(h.ratio_disk, Some(0.0));
        assert_eq!(h.disk_free_bytes, Some(50 << 20));
    }

    #[test]
    fn the_connection_cap_limits_when_it_is_nearest() {
        let mut i = base();
        i.max_connections = 1500;
        let h = compute(&i);
        assert_eq!(h.headroom_connections, 500);
        assert_eq!(h.limiting_resource, "max_connections");
        i.max_connections = 900; // already past it (lowered at runtime): no room
        assert_eq!(compute(&i).headroom_connections, 0);
        i.max_connections = 10_000_000; // farther than memory: memory limits
        assert_eq!(compute(&i).limiting_resource, "memory");
    }

    #[test]
    fn memory_limits_when_fds_are_plenty() {
        let h = compute(&base());
        assert!(h.per_connection_measured);
        assert_eq!(h.per_connection_bytes, (50 << 20) / 1000);
        let expect =
            ((1u64 << 30) as f64 * 0.9 - (100u64 << 20) as f64) / h.per_connection_bytes as f64;
        assert_eq!(h.headroom_connections, expect as u64);
        assert_eq!(h.limiting_resource, "memory");
        assert_eq!(h.headroom_msgs_per_sec, None);
    }

    #[test]
    fn fds_and_cpu_can_limit() {
        let mut i = base();
        i.max_fds = 2048;
        let h = compute(&i);
        assert_eq!(h.limiting_resource, "fds");
        assert_eq!(h.headroom_connections, (2048.0 * 0.95 - 1010.0) as u64);

        let mut i = base();
        i.cpu_busy = 0.4;
        i.msg_rate = 10_000.0;
        let h = compute(&i);
        assert_eq!(h.limiting_resource, "cpu");
        assert_eq!(h.headroom_connections, 1000);
        assert_eq!(h.headroom_msgs_per_sec, Some(10_000.0));
        assert!((h.ratio_cpu - 0.6).abs() < 1e-9);
    }

    #[test]
    fn few_connections_use_the_estimate_and_overload_gives_zero() {
        let mut i = base();
        i.connections = 3;
        let h = compute(&i);
        assert!(!h.per_connection_measured);
        assert_eq!(h.per_connection_bytes, 20_000);
        let mut i = base();
        i.rss_bytes = 1 << 30;
        i.cpu_busy = 0.95;
        let h = compute(&i);
        assert_eq!(h.headroom_connections, 0);
        assert_eq!(h.ratio_memory, 0.0);
    }
}
