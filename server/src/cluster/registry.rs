//! Node registry: the last load report of every node, as read from the KV bucket
//! `<prefix>-nodes`, and two questions about each node:
//! - *alive*: a report younger than the TTL. Cross-node pushes and group notices still go
//!   to it (a node that is only slow gets them when it resumes; one that is dead costs
//!   a dropped publish).
//! - *live*: a report younger than `stale_after` (a few report intervals). Only live
//!   nodes are offered to new connections and shown healthy; a node that stops being
//!   live is *lost* (it missed its reports), and *back* when it reports again
//!   ([`Registry::sweep_at`] names both, once each).
//!
//! It also makes the routing choice for a new connection (least loaded, weighted by
//! connections and CPU). Pure data: the KV watch in `cluster` feeds it; `/v1/route`, the
//! router and the admin overview read it.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// What a node publishes about itself every `cluster.report_interval_ms`: the admin
/// API's type, since the overview shows each node's last report as it is.
pub use im_admin_api::NodeReport as LoadReport;

/// One node as the admin overview shows it: its last report, the report's age,
/// `healthy`, `state` and the routing score.
pub use im_admin_api::ClusterNode as NodeView;

struct Seen {
    report: LoadReport,
    at: Instant,
    /// Connections routed to it since its last report (they are not in it yet).
    pending: u64,
    /// The last sweep found it stale (reported lost, not back yet).
    lost: bool,
    /// Its reports stopped for longer than the staleness limit and came back between
    /// two sweeps (the next sweep names it lost and back at once).
    blip: bool,
}

/// The registry cache of one node.
pub struct Registry {
    ttl: Duration,
    stale_after: Duration,
    cpu_weight: f64,
    nodes: RwLock<HashMap<String, Seen>>,
}

/// What a sweep found: nodes that just went stale, and nodes that report again.
#[derive(Debug, Default, PartialEq)]
pub struct Sweep {
    /// Live at the previous sweep, stale now.
    pub lost: Vec<String>,
    /// Lost at the previous sweep, live now.
    pub back: Vec<String>,
    /// Nodes live now.
    pub live: usize,
}

/// The routing score: `(connections + pending + 1) * (1 + cpu_weight * cpu_busy)`; lower
/// is less loaded. Connections count first (long-lived, each one costs memory), CPU
/// weights them (a busy node takes fewer), the "least connections, weighted" rule of the field reports.
pub fn score(r: &LoadReport, pending: u64, cpu_weight: f64) -> f64 {
    (r.connections + pending + 1) as f64 * (1.0 + cpu_weight * r.cpu_busy.clamp(0.0, 1.0))
}

impl Registry {
    /// An empty registry: reports older than `stale_after` are out of rotation (clamped
    /// to `ttl`), older than `ttl` dead.
    pub fn new(ttl: Duration, stale_after: Duration, cpu_weight: f64) -> Self {
        Registry {
            ttl,
            stale_after: stale_after.min(ttl),
            cpu_weight,
            nodes: RwLock::new(HashMap::new()),
        }
    }

    /// The staleness limit (see the module header).
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Records a report received now that was written `age` ago.
    pub fn observe(&self, report: LoadReport, age: Duration) -> bool {
        let now = Instant::now();
        self.observe_at(report, now.checked_sub(age).unwrap_or(now))
    }

    /// Records a report written at `at`; false (and ignored) when it names a live node
    /// under another identity (`instance`).
    pub fn observe_at(&self, report: LoadReport, at: Instant) -> bool {
        if let Ok(mut n) = self.nodes.write() {
            if let Some(live) = n.get(&report.node_id) {
                let other = live.report.instance != report.instance;
                if other
                    && !live.report.instance.is_empty()
                    && !live.lost
                    && live.at.elapsed() < self.stale_after
                {
                    return false;
                }
            }
            let (lost, blip) = match n.get(&report.node_id) {
                Some(s) => (
                    s.lost,
                    s.blip || (!s.lost && at.saturating_duration_since(s.at) >= self.stale_after),
                ),
                None => (false, false),
            };
            n.insert(
                report.node_id.clone(),
                Seen {
                    report,
                    at,
                    pending: 0,
                    lost,
                    blip,
                },
            );
            // Forget nodes silent for a long time (ids of retired nodes).
            let forget = self.ttl * 20;
            n.retain(|_, s| s.at.elapsed() < forget);
        }
        true
    }

    /// Forgets a node (its key was deleted: a clean shutdown); whether it was known.
    pub fn remove(&self, node_id: &str) -> bool {
        self.nodes
            .write()
            .map(|mut n| n.remove(node_id).is_some())
            .unwrap_or(false)
    }

    /// Marks nodes that went stale since the last sweep as lost and lost nodes that
    /// report again as back; each transition is named once. A node whose reports
    /// stopped and resumed between two sweeps is named in both.
    pub fn sweep_at(&self, now: Instant) -> Sweep {
        let mut out = Sweep::default();
        if let Ok(mut n) = self.nodes.write() {
            for (id, s) in n.iter_mut() {
                let live = now.saturating_duration_since(s.at) < self.stale_after;
                out.live += usize::from(live);
                if live && (s.lost || s.blip) {
                    if !s.lost {
                        out.lost.push(id.clone());
                    }
                    out.back.push(id.clone());
                    (s.lost, s.blip) = (false, false);
                } else if !live && !s.lost {
                    (s.lost, s.blip) = (true, false);
                    out.lost.push(id.clone());
                }
            }
        }
        out.lost.sort();
        out.back.sort();
        out
    }

    /// Whether `node_id` reported within the TTL.
    pub fn alive(&self, node_id: &str) -> bool {
        self.nodes
            .read()
            .ok()
            .and_then(|n| n.get(node_id).map(|s| s.at.elapsed() < self.ttl))
            .unwrap_or(false)
    }

    /// Ids of the nodes that reported within the TTL.
    pub fn live_nodes(&self) -> Vec<String> {
        self.nodes
            .read()
            .map(|n| {
                n.iter()
                    .filter(|(_, s)| s.at.elapsed() < self.ttl)
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every known node, sorted by id.
    pub fn view(&self) -> Vec<NodeView> {
        self.view_at(Instant::now())
    }

    /// As [`Registry::view`] at `now`.
    pub fn view_at(&self, now: Instant) -> Vec<NodeView> {
        let mut v: Vec<NodeView> = self
            .nodes
            .read()
            .map(|n| {
                n.values()
                    .map(|s| {
                        let age = now.saturating_duration_since(s.at);
                        let healthy = age < self.stale_after;
                        NodeView {
                            report: s.report.clone(),
                            report_age_ms: age.as_millis() as u64,
                            healthy,
                            state: match (healthy, s.report.draining) {
                                (false, _) => "down",
                                (true, true) => "draining",
                                (true, false) => "up",
                            }
                            .to_owned(),
                            score: score(&s.report, s.pending, self.cpu_weight),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.report.node_id.cmp(&b.report.node_id));
        v
    }

    /// The least-loaded live node that is not draining and not in `avoid`, counted as
    /// one more pending connection so a burst of routes spreads before the next report.
    /// Nodes with capacity headroom left go first; `None` when no node qualifies.
    pub fn choose(&self, avoid: &[&str]) -> Option<LoadReport> {
        self.choose_at(Instant::now(), avoid)
    }

    /// As [`Registry::choose`] at `now`.
    pub fn choose_at(&self, now: Instant, avoid: &[&str]) -> Option<LoadReport> {
        let mut n = self.nodes.write().ok()?;
        let best = n
            .iter()
            .filter(|(id, s)| {
                now.saturating_duration_since(s.at) < self.stale_after
                    && !s.report.draining
                    && !s.report.ws_url.is_empty()
                    && !avoid.contains(&id.as_str())
            })
            .min_by(|(_, a), (_, b)| {
                // No headroom left (a node that has not measured yet names no resource).
                let full = |s: &Seen| {
                    s.report.headroom_connections == 0 && !s.report.limiting_resource.is_empty()
                };
                full(a).cmp(&full(b)).then(
                    score(&a.report, a.pending, self.cpu_weight).total_cmp(&score(
                        &b.report,
                        b.pending,
                        self.cpu_weight,
                    )),
                )
            })
            .map(|(id, _)| id.clone())?;
        let s = n.get_mut(&best)?;
        s.pending += 1;
        Some(s.report.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, connections: u64, cpu: f64) -> LoadReport {
        LoadReport {
            node_id: id.into(),
            ws_url: format!("ws://{id}/ws"),
            connections,
            cpu_busy: cpu,
            headroom_connections: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn a_report_conflicting_with_a_live_nodes_identity_is_ignored() {
        let r = Registry::new(Duration::from_secs(10), Duration::from_secs(10), 1.0);
        let now = Instant::now();
        let with = |instance: &str, url: &str| LoadReport {
            instance: instance.into(),
            ws_url: url.into(),
            ..report("a", 1, 0.0)
        };
        assert!(r.observe_at(with("i1", "ws://a/ws"), now));
        assert!(
            r.observe_at(with("i1", "ws://a/ws"), now),
            "the same process again"
        );
        assert!(
            !r.observe_at(with("i2", "ws://evil/ws"), now),
            "another identity"
        );
        assert_eq!(r.choose_at(now, &[]).unwrap().ws_url, "ws://a/ws");
        // Once the live one has expired, a new identity (a restarted node) is taken.
        let r = Registry::new(Duration::from_millis(1), Duration::from_millis(1), 1.0);
        r.observe_at(with("i1", "ws://a/ws"), now);
        std::thread::sleep(Duration::from_millis(5));
        assert!(r.observe_at(with("i2", "ws://a2/ws"), Instant::now()));
    }

    #[test]
    fn picks_least_connections_weighted_by_cpu() {
        let r = Registry::new(Duration::from_secs(15), Duration::from_secs(5), 1.0);
        let now = Instant::now();
        r.observe_at(report("a", 100, 0.0), now);
        r.observe_at(report("b", 60, 0.9), now);
        r.observe_at(report("c", 80, 0.1), now);
        // a: 101, b: 61 * 1.9 = 115.9, c: 81 * 1.1 = 89.1
        assert_eq!(r.choose_at(now, &[]).unwrap().node_id, "c");
        assert_eq!(r.choose_at(now, &["c"]).unwrap().node_id, "a");
    }

    #[test]
    fn a_burst_spreads_before_the_next_report() {
        let r = Registry::new(Duration::from_secs(15), Duration::from_secs(5), 0.0);
        let now = Instant::now();
        r.observe_at(report("a", 50, 0.0), now);
        r.observe_at(report("b", 0, 0.0), now);
        r.observe_at(report("c", 0, 0.0), now);
        let mut count = HashMap::new();
        for _ in 0..100 {
            *count
                .entry(r.choose_at(now, &[]).unwrap().node_id)
                .or_insert(0) += 1;
        }
        // b and c fill up to a's 50 first, then all three share the rest.
        assert!((48..=52).contains(&count["b"]), "{count:?}");
        assert!((48..=52).contains(&count["c"]), "{count:?}");
        assert!(count.get("a").copied().unwrap_or(0) <= 2, "{count:?}");
        // A new report from b resets its pending count (40: it has not seen them all).
        r.observe_at(report("b", 40, 0.0), now);
        assert_eq!(r.choose_at(now, &[]).unwrap().node_id, "b");
    }

    #[test]
    fn stale_draining_and_full_nodes_are_out_of_rotation() {
        let ttl = Duration::from_secs(15);
        let r = Registry::new(ttl, Duration::from_secs(5), 1.0);
        let now = Instant::now() + Duration::from_secs(60);
        r.observe_at(report("old", 0, 0.0), now - Duration::from_secs(16));
        let mut d = report("drain", 0, 0.0);
        d.draining = true;
        r.observe_at(d, now);
        let mut full = report("full", 0, 0.0);
        full.headroom_connections = 0;
        full.limiting_resource = "fds".into();
        r.observe_at(full, now);
        r.observe_at(report("busy", 500, 0.5), now);
        assert_eq!(r.choose_at(now, &[]).unwrap().node_id, "busy");
        assert_eq!(r.choose_at(now, &["busy"]).unwrap().node_id, "full");
        assert!(r.choose_at(now, &["busy", "full"]).is_none());
        let states: Vec<(String, String)> = r
            .view_at(now)
            .into_iter()
            .map(|v| (v.report.node_id, v.state))
            .collect();
        assert!(
            states.contains(&("old".into(), "down".into())),
            "{states:?}"
        );
        assert!(
            states.contains(&("drain".into(), "draining".into())),
            "{states:?}"
        );
        r.remove("busy");
        assert_eq!(r.view_at(now).len(), 3);
    }

    #[test]
    fn a_node_that_misses_its_reports_leaves_rotation_before_the_ttl() {
        // Reports every second, lost after 2.5 s of silence, dead after 15 s.
        let r = Registry::new(Duration::from_secs(15), Duration::from_millis(2500), 0.0);
        let t0 = Instant::now();
        r.observe_at(report("a", 0, 0.0), t0);
        r.observe_at(report("b", 10, 0.0), t0);
        assert_eq!(r.choose_at(t0, &[]).unwrap().node_id, "a");
        assert_eq!(
            r.sweep_at(t0),
            Sweep {
                live: 2,
                ..Default::default()
            }
        );
        // b keeps reporting; a (least loaded) stops.
        let t1 = t0 + Duration::from_secs(2);
        r.observe_at(report("b", 10, 0.0), t1);
        assert_eq!(
            r.choose_at(t1, &[]).unwrap().node_id,
            "a",
            "one late report"
        );
        let t2 = t0 + Duration::from_secs(3);
        r.observe_at(report("b", 10, 0.0), t2);
        for _ in 0..5 {
            assert_eq!(r.choose_at(t2, &[]).unwrap().node_id, "b");
        }
        assert!(r.choose_at(t2, &["b"]).is_none());
        // Still alive (within the TTL): pushes go on; but not healthy in the view.
        assert!(r.alive("a"));
        let view = r.view_at(t2);
        assert_eq!((view[0].healthy, view[0].state.as_str()), (false, "down"));
        assert_eq!((view[1].healthy, view[1].state.as_str()), (true, "up"));
        // Named lost once.
        assert_eq!(
            r.sweep_at(t2),
            Sweep {
                lost: vec!["a".into()],
                back: vec![],
                live: 1
            }
        );
        assert_eq!(r.sweep_at(t2 + Duration::from_millis(10)).lost.len(), 0);
        // It reports again: back once, and routable.
        r.observe_at(report("b", 10, 0.0), t0 + Duration::from_millis(4500));
        let t3 = t0 + Duration::from_secs(6);
        r.observe_at(report("a", 0, 0.0), t3);
        r.observe_at(report("b", 10, 0.0), t3);
        assert_eq!(
            r.sweep_at(t3),
            Sweep {
                lost: vec![],
                back: vec!["a".into()],
                live: 2
            }
        );
        assert_eq!(r.sweep_at(t3).back.len(), 0);
        assert_eq!(r.choose_at(t3, &[]).unwrap().node_id, "a");
        // A clean leave forgets it at once.
        assert!(r.remove("a"));
        assert!(!r.remove("a"));
        assert_eq!(r.choose_at(t3, &[]).unwrap().node_id, "b");
    }

    #[test]
    fn a_silence_between_two_sweeps_is_named_lost_and_back() {
        let r = Registry::new(Duration::from_secs(15), Duration::from_secs(5), 0.0);
        let t0 = Instant::now();
        r.observe_at(report("a", 0, 0.0), t0);
        assert_eq!(r.sweep_at(t0).live, 1);
        // Silent for 6 s, but the next sweep comes after its next report.
        r.observe_at(report("a", 0, 0.0), t0 + Duration::from_secs(6));
        // A report within the limit is no gap.
        r.observe_at(report("a", 0, 0.0), t0 + Duration::from_secs(7));
        let sweep = r.sweep_at(t0 + Duration::from_secs(7));
        assert_eq!(
            (sweep.lost, sweep.back),
            (vec!["a".into()], vec!["a".into()])
        );
        assert_eq!(
            r.sweep_at(t0 + Duration::from_secs(8)),
            Sweep {
                live: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_staleness_limit_never_exceeds_the_ttl() {
        let r = Registry::new(Duration::from_secs(3), Duration::from_secs(10), 0.0);
        assert_eq!(r.stale_after(), Duration::from_secs(3));
    }
}
